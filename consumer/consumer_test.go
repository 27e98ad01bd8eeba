package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/store/mem"
)

func nop(context.Context, *pubsub.Message) error { return nil }

func TestOptionsValidation(t *testing.T) {
	cases := []struct {
		name  string
		store dedup.Store
		opt   consumer.Options
		f     consumer.HandlerFunc
		want  string // "" means valid
	}{
		{"zero value", mem.New(), consumer.Options{}, nop, ""},
		{"full", mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id", Missing: dedup.Reject, ProducerAttribute: "source", Horizon: time.Hour, Lease: time.Minute}, HandlerTimeout: 50 * time.Second}, nop, ""},
		{"nil store", nil, consumer.Options{}, nop, "nil store"},
		{"nil handler", mem.New(), consumer.Options{}, nil, "nil handler"},
		{"short horizon", mem.New(), consumer.Options{Policy: dedup.Policy{Horizon: 500 * time.Millisecond}}, nop, "horizon 500ms is below the minimum of 1s"},
		{"negative horizon", mem.New(), consumer.Options{Policy: dedup.Policy{Horizon: -time.Minute}}, nop, "below the minimum"},
		{"negative lease", mem.New(), consumer.Options{Policy: dedup.Policy{Lease: -time.Second}}, nop, "lease -1s must be positive"},
		{"negative timeout", mem.New(), consumer.Options{HandlerTimeout: -time.Second}, nop, "handler timeout -1s must be positive"},
		{"timeout past lease", mem.New(), consumer.Options{Policy: dedup.Policy{Lease: 10 * time.Second}, HandlerTimeout: 10 * time.Second}, nop,
			"handler timeout 10s must be shorter than the lease 10s"},
		{"default timeout vs lease", mem.New(), consumer.Options{HandlerTimeout: time.Minute}, nop, "shorter than the lease 30s"},
		{"unknown policy", mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "k", Missing: 7}}, nop, "unknown Missing policy 7"},
		{"reject without attribute", mem.New(), consumer.Options{Policy: dedup.Policy{Missing: dedup.Reject}}, nop, "Missing reject needs an IDAttribute"},
		{"producer without attribute", mem.New(), consumer.Options{Policy: dedup.Policy{ProducerAttribute: "source"}}, nop, `ProducerAttribute "source" needs an IDAttribute`},
		{"long attribute", mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: strings.Repeat("a", 257)}}, nop, "IDAttribute: invalid attribute key"},
		{"binary attribute", mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "\xff"}}, nop, "not valid UTF-8"},
		{"JSON without a path", mem.New(), consumer.Options{Policy: dedup.Policy{From: dedup.KeyFromJSON}}, nop, "dedup.KeyFromJSON needs a Path"},
		{"path without JSON", mem.New(), consumer.Options{Policy: dedup.Policy{Path: "order.id"}}, nop, `path "order.id" needs From dedup.KeyFromJSON`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := consumer.New(c.store, c.opt, c.f)
			h, herr := consumer.Handler(c.store, c.opt, c.f)
			if c.want == "" {
				if err != nil || herr != nil || d == nil || h == nil {
					t.Fatalf("New: %v; Handler: %v", err, herr)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, consumer.ErrInvalidOptions) {
				t.Fatalf("New error %v, want one containing %q that wraps ErrInvalidOptions", err, c.want)
			}
			if herr == nil || herr.Error() != err.Error() || h != nil {
				t.Fatalf("Handler error %v, want the same as New's", herr)
			}
		})
	}
}

// The missing-id policies, on a message that lacks the id attribute.
func TestMissingID(t *testing.T) {
	type result struct {
		handled  []string // keys from the handler's context ("-" for none)
		rejected []error
	}
	run := func(t *testing.T, opt consumer.Options, onReject bool) (*env, *consumer.Dedup, string, func() result) {
		e := newEnv(t, "pstest")
		var mu sync.Mutex
		var r result
		if onReject {
			opt.OnReject = func(_ context.Context, m *pubsub.Message, reason error) error {
				mu.Lock()
				r.rejected = append(r.rejected, reason)
				mu.Unlock()
				if m.Attributes["source"] != "billing" {
					return errors.New("OnReject got another message")
				}
				return nil
			}
		}
		opt.IDAttribute, opt.ProducerAttribute = "event_id", "source"
		d := mustNew(t, mem.New(), opt, func(ctx context.Context, _ *pubsub.Message) error {
			k, ok := consumer.KeyFromContext(ctx)
			if !ok {
				k = "-"
			}
			mu.Lock()
			r.handled = append(r.handled, k)
			mu.Unlock()
			return nil
		})
		e.receive(nil, d.Handle)
		id, err := e.pub.Publish(context.Background(), &pubsub.Message{Data: []byte("x"), Attributes: map[string]string{"source": "billing"}}).Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return e, d, id, func() result { mu.Lock(); defer mu.Unlock(); return r }
	}

	t.Run("fallback keys by message ID", func(t *testing.T) {
		_, d, id, got := run(t, consumer.Options{}, false)
		eventually(t, "handled", func() bool { return d.Counts().Emitted == 1 })
		if r := got(); len(r.handled) != 1 || r.handled[0] != dedup.MessageIDKey(id) {
			t.Errorf("handler saw keys %v, want the message ID %s", r.handled, id)
		}
		if c := d.Counts(); c.MissingID != 1 {
			t.Errorf("counts %+v, want the missing id counted", c)
		}
	})
	t.Run("pass runs the handler without a key", func(t *testing.T) {
		_, d, _, got := run(t, consumer.Options{Policy: dedup.Policy{Missing: dedup.Pass}}, false)
		eventually(t, "handled", func() bool { return d.Counts().Emitted == 1 })
		if r := got(); len(r.handled) != 1 || r.handled[0] != "-" {
			t.Errorf("handler saw keys %v, want none", r.handled)
		}
	})
	t.Run("reject hands it to OnReject and acks", func(t *testing.T) {
		e, d, id, got := run(t, consumer.Options{Policy: dedup.Policy{Missing: dedup.Reject}}, true)
		eventually(t, "rejected", func() bool { return d.Counts().DeadLettered == 1 })
		eventually(t, "the ack", func() bool { return e.srv.Message(id).Acks == 1 })
		r := got()
		if len(r.handled) != 0 || len(r.rejected) != 1 || !errors.Is(r.rejected[0], dedup.ErrKeyMissing) {
			t.Errorf("handled %v, rejected %v; want no handler call and one ErrKeyMissing", r.handled, r.rejected)
		}
		if c := d.Counts(); c.MissingID != 1 {
			t.Errorf("counts %+v, want the missing id counted", c)
		}
	})
	t.Run("reject without OnReject nacks, never acks", func(t *testing.T) {
		e, d, id, got := run(t, consumer.Options{Policy: dedup.Policy{Missing: dedup.Reject}}, false)
		eventually(t, "two nacks", func() bool { return d.Counts().Retried >= 2 })
		if m := e.srv.Message(id); m.Acks != 0 {
			t.Errorf("rejected message acked %d times", m.Acks)
		}
		if r := got(); len(r.handled) != 0 {
			t.Errorf("handler ran for a rejected message: %v", r.handled)
		}
		if c := d.Counts(); c.Retried > 12 {
			t.Errorf("%d nacks already: the message spins instead of being held", c.Retried)
		}
	})
}

// flaky is a store that is down while down is set.
type flaky struct {
	dedup.Store
	down   atomic.Bool
	claims atomic.Int32
}

func (f *flaky) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	f.claims.Add(1)
	if f.down.Load() {
		return dedup.Verdict{}, fmt.Errorf("%w: injected outage", dedup.ErrUnavailable)
	}
	return f.Store.Claim(ctx, c)
}

// A store outage: the message is held and nacked, the store sees a
// trickle of claims rather than a hot loop, nothing is acked or handled;
// once the store is back, the message is handled once.
func TestStoreUnavailable(t *testing.T) {
	e := newEnv(t, "pstest")
	st := &flaky{Store: mem.New()}
	st.down.Store(true)
	var handled atomic.Int32
	d := mustNew(t, st, consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}}, func(context.Context, *pubsub.Message) error {
		handled.Add(1)
		return nil
	})
	e.receive(nil, d.Handle)
	id := e.publish("x", "k")
	eventually(t, "a failed claim", func() bool { return st.claims.Load() >= 1 })
	time.Sleep(1500 * time.Millisecond)
	// Pauses of 100, 200, 400, 800ms, each jittered down to half at most.
	if n := st.claims.Load(); n > 12 {
		t.Errorf("%d claims in 1.5s of outage: a hot loop, not a backoff", n)
	}
	if d.Ready() {
		t.Error("Ready during the outage")
	}
	if handled.Load() != 0 || e.srv.Message(id).Acks != 0 {
		t.Fatal("message handled or acked while the store was down")
	}
	st.down.Store(false)
	eventually(t, "handled after recovery", func() bool { return d.Counts().Emitted == 1 })
	eventually(t, "the ack", func() bool { return e.srv.Message(id).Acks == 1 })
	if !d.Ready() || handled.Load() != 1 {
		t.Errorf("ready %v, handled %d times; want ready and once", d.Ready(), handled.Load())
	}
}

// The pipeline's metric names, when a Registerer is given.
func TestMetrics(t *testing.T) {
	e := newEnv(t, "pstest")
	reg := prometheus.NewRegistry()
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}, Registerer: reg}, nop)
	e.receive(nil, d.Handle)
	e.publish("a", "k")
	eventually(t, "handled", func() bool { return d.Counts().Emitted == 1 })
	e.publish("b", "k")
	eventually(t, "the republish", func() bool { return d.Counts().DuplicateRepublish == 1 })

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				got[name] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	want := map[string]float64{
		"dedupflow_received_total":                               2,
		"dedupflow_messages_total{outcome=emitted}":              1,
		"dedupflow_messages_total{outcome=duplicate_republish}":  1,
		"dedupflow_messages_total{outcome=duplicate_redelivery}": 0,
		"dedupflow_messages_total{outcome=retried}":              0,
		"dedupflow_messages_total{outcome=in_flight_conflict}":   0,
		"dedupflow_messages_total{outcome=dead_lettered}":        0,
		"dedupflow_handler_batch_seconds":                        1,
		"dedupflow_store_batch_seconds":                          2,
		"dedupflow_end_to_end_latency_seconds":                   1,
	}
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, v)
		}
	}
	if _, err := consumer.New(mem.New(), consumer.Options{Registerer: reg}, nop); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Errorf("a second Dedup on the same registry: %v, want a registration error", err)
	}
}

// Messages without the id attribute are warned of, once a minute: a
// publisher that does not stamp it (or a misspelt attribute) silently turns
// republish dedup off otherwise.
func TestMissingIDWarned(t *testing.T) {
	e := newEnv(t, "pstest")
	var log testenv.Buffer
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"},
		Logger: slog.New(slog.NewTextHandler(&log, nil)), Now: clock},
		func(context.Context, *pubsub.Message) error { return nil })
	e.receive(nil, d.Handle)
	warnings := func() int { return strings.Count(log.String(), "do the publishers stamp it?") }
	for range 3 {
		e.publish("x", "")
	}
	eventually(t, "three handled", func() bool { return d.Counts().Emitted == 3 })
	if n := warnings(); n != 1 || !strings.Contains(log.String(), "without the id attribute event_id are deduped on their message ID only, so a republished copy passes") {
		t.Fatalf("%d warnings for 3 keyless messages in a minute, want 1 naming the attribute and the cost:\n%s", n, log.String())
	}
	mu.Lock()
	now = now.Add(61 * time.Second)
	mu.Unlock()
	e.publish("x", "")
	eventually(t, "four handled", func() bool { return d.Counts().Emitted == 4 })
	if n := warnings(); n != 2 {
		t.Errorf("%d warnings after a minute more, want 2:\n%s", n, log.String())
	}
}
