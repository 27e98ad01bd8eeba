package consumer_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// A handler that fails the first time for a key sees that key again and
// succeeds once. Its stray m.Ack() before failing must not lose the
// message, and the key is in its context.
func TestFailedHandlerRunsAgain(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			c := newCalls()
			var badKey atomic.Value
			d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}}, func(ctx context.Context, m *pubsub.Message) error {
				key := m.Attributes["event_id"]
				if k, ok := consumer.KeyFromContext(ctx); !ok || k != key {
					badKey.Store(k)
				}
				n, done := c.enter(key)
				if key == "k1" && n == 1 {
					m.Ack() // a no-op on the handler's copy
					err := errors.New("downstream refused")
					done(err)
					return err
				}
				done(nil)
				return nil
			})
			e.receive(nil, d.Handle)
			e.publish("one", "k1")
			e.publish("two", "k2")
			eventually(t, "both handled", func() bool { return d.Counts().Emitted == 2 })
			time.Sleep(300 * time.Millisecond) // anything more would show up now
			if n, ok := c.get("k1"); n != 2 || ok != 1 {
				t.Errorf("k1: %d calls, %d successful; want 2 calls, 1 successful", n, ok)
			}
			if n, ok := c.get("k2"); n != 1 || ok != 1 {
				t.Errorf("k2: %d calls, %d successful; want 1 and 1", n, ok)
			}
			if k := badKey.Load(); k != nil {
				t.Errorf("KeyFromContext gave %q, want the event_id", k)
			}
			if got := d.Counts(); got.Emitted != 2 || got.Retried != 1 || got.Received != 3 {
				t.Errorf("counts %+v, want 2 emitted, 1 retried, 3 received", got)
			}
		})
	}
}

// Republished copies (new message IDs, same key) never reach the handler;
// OnDuplicate sees each as a republish.
func TestRepublishNeverReachesHandler(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			c := newCalls()
			var seen dups
			d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}, OnDuplicate: func(_ context.Context, m *pubsub.Message, k dedup.Kind) { seen.add(m.ID, k.String()) }}, func(_ context.Context, m *pubsub.Message) error {
				_, done := c.enter(m.Attributes["event_id"])
				time.Sleep(20 * time.Millisecond) // so copies can arrive while it runs
				done(nil)
				return nil
			})
			e.receive(nil, d.Handle)
			ids := []string{e.publish("first", "order-1"), e.publish("retry 1", "order-1"), e.publish("retry 2", "order-1")}
			eventually(t, "two republishes", func() bool { return d.Counts().DuplicateRepublish == 2 })
			time.Sleep(300 * time.Millisecond)
			if n, ok := c.get("order-1"); n != 1 || ok != 1 {
				t.Fatalf("handler ran %d times (%d successful), want once", n, ok)
			}
			got := seen.list()
			if len(got) != 2 {
				t.Fatalf("OnDuplicate calls %v, want 2", got)
			}
			for _, x := range got {
				if x.kind != "republish" || !slices.Contains(ids, x.id) {
					t.Errorf("OnDuplicate(%s, %s), want a republish of one of %v", x.id, x.kind, ids)
				}
			}
			if cn := d.Counts(); cn.Emitted != 1 || cn.DuplicateRedelivery != 0 {
				t.Errorf("counts %+v, want 1 emitted and no redelivery", cn)
			}
		})
	}
}

// The handler succeeded but its ack was lost: after the ack deadline the
// same message ID comes back, and it is acked as a redelivery without
// reaching the handler.
func TestRedeliveryAfterLostAck(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			e.loss.sub.Store(e.sub)
			var handled atomic.Int32
			var seen dups
			d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}, OnDuplicate: func(_ context.Context, m *pubsub.Message, k dedup.Kind) { seen.add(m.ID, k.String()) }}, func(context.Context, *pubsub.Message) error {
				handled.Add(1)
				return nil
			})
			e.receive(nil, d.Handle)
			id := e.publish("payment", "pay-7")
			eventually(t, "the first ack to be lost", func() bool { return e.loss.lost.Load() == 1 })
			if d.Counts().Emitted != 1 {
				t.Fatalf("counts %+v, want the handler to have succeeded before its ack", d.Counts())
			}
			e.clock.advance(15 * time.Second) // past the 10 s ack deadline
			eventually(t, "the redelivery", func() bool { return d.Counts().DuplicateRedelivery == 1 })
			if got := seen.list(); len(got) != 1 || got[0] != (dup{id, "redelivery"}) {
				t.Errorf("OnDuplicate calls %v, want one redelivery of %s", got, id)
			}
			if e.srv != nil {
				if m := e.srv.Message(id); m == nil || m.Deliveries < 2 {
					t.Errorf("message %s was not delivered twice: %+v", id, m)
				}
			}
			time.Sleep(300 * time.Millisecond)
			if n := handled.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want once", n)
			}
		})
	}
}

// A panicking handler: the panic goes on (the test's callback stands in
// for a supervisor that recovers it), the key is released at once — a
// republished copy does not wait for the 30 s lease — and the message is
// nacked, so exactly one of the two copies is then handled.
func TestPanicReleasesKeyAndGoesOn(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			c := newCalls()
			d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id", Lease: 30 * time.Second}},
				func(_ context.Context, m *pubsub.Message) error {
					n, done := c.enter(m.Attributes["event_id"])
					if n == 1 {
						done(errors.New("panicked"))
						panic("handler bug")
					}
					done(nil)
					return nil
				})
			var panics atomic.Int32
			e.receive(nil, func(ctx context.Context, m *pubsub.Message) {
				defer func() {
					if v := recover(); v != nil {
						if v != "handler bug" {
							t.Errorf("recovered %v, want the handler's own panic value", v)
						}
						panics.Add(1)
					}
				}()
				d.Handle(ctx, m)
			})
			start := time.Now()
			e.publish("first", "k")
			eventually(t, "the panic", func() bool { return panics.Load() == 1 })
			e.publish("copy", "k")
			eventually(t, "one success", func() bool { return d.Counts().Emitted == 1 })
			if took := time.Since(start); took > 15*time.Second {
				t.Errorf("handled after %v: the key waited for its lease instead of being released", took)
			}
			eventually(t, "the other copy as a duplicate", func() bool {
				cn := d.Counts()
				return cn.DuplicateRepublish+cn.DuplicateRedelivery == 1
			})
			if n, ok := c.get("k"); n != 2 || ok != 1 {
				t.Errorf("handler: %d calls, %d successful; want the panic and one success", n, ok)
			}
			if cn := d.Counts(); cn.Retried < 1 {
				t.Errorf("counts %+v, want the panicked message counted as retried", cn)
			}
		})
	}
}

// While one copy's handler runs, another copy of the key waits for it (no
// nack, no redelivery) and is acked as a duplicate once the handler
// committed.
func TestInFlightCopyWaits(t *testing.T) {
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			release := make(chan struct{})
			var handled atomic.Int32
			d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}}, func(ctx context.Context, _ *pubsub.Message) error {
				handled.Add(1)
				select {
				case <-release:
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			})
			e.receive(nil, d.Handle)
			e.publish("a", "same")
			eventually(t, "the first handler call", func() bool { return handled.Load() == 1 })
			e.publish("b", "same")
			time.Sleep(time.Second)
			if cn := d.Counts(); cn.InFlightConflict != 0 || cn.DuplicateRepublish != 0 {
				t.Errorf("counts %+v while the first handler runs: the copy should be waiting, neither nacked nor judged", cn)
			}
			close(release)
			eventually(t, "the copy as a duplicate", func() bool { return d.Counts().DuplicateRepublish == 1 })
			if n := handled.Load(); n != 1 {
				t.Fatalf("handler ran %d times, want once", n)
			}
		})
	}
}
