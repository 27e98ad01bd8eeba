package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/dedupflow/dedupflow/store/mem"
)

// rejects records OnReject calls by message ID.
type rejects struct {
	mu  sync.Mutex
	why map[string]error
}

func (r *rejects) take(_ context.Context, m *pubsub.Message, reason error) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.why == nil {
		r.why = map[string]error{}
	}
	r.why[m.ID] = reason
	return nil
}

func (r *rejects) get(id string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.why[id]
}

// The consumer takes keys from a JSON body, as the pipeline's --key-from
// json:PATH does: two messages with one order id run the handler once.
func TestKeyFromBody(t *testing.T) {
	e := newEnv(t, "broker")
	c := newCalls()
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{From: dedup.KeyFromJSON, Path: "order.id"}},
		func(ctx context.Context, m *pubsub.Message) error {
			k, _ := consumer.KeyFromContext(ctx)
			_, done := c.enter(k)
			done(nil)
			return nil
		})
	e.receive(nil, d.Handle)
	e.publish(`{"order":{"id":"A-1"}}`, "")
	e.publish(`{"order":{"id":"A-1"},"retry":1}`, "")
	eventually(t, "both settled", func() bool { n := d.Counts(); return n.Emitted+n.DuplicateRepublish == 2 })
	if n, ok := c.get("A-1"); n != 1 || ok != 1 {
		t.Fatalf("handler ran %d times for order A-1, want once", n)
	}
	if _, err := consumer.New(mem.New(), consumer.Options{Policy: dedup.Policy{From: dedup.KeyFromJSON}}, nop); !errors.Is(err, consumer.ErrInvalidOptions) {
		t.Errorf("KeyFromJSON without a path: %v, want ErrInvalidOptions", err)
	}
}

// The event time comes from the timestamp attribute; a message whose
// attribute is malformed goes to OnReject with the reason, never to the
// handler, and is acked only because OnReject took it.
func TestTimestampAttribute(t *testing.T) {
	e := newEnv(t, "pstest")
	var rj rejects
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id", TimestampAttribute: "occurred_at"}, OnReject: rj.take}, nop)
	e.receive(nil, d.Handle)
	bad, err := e.pub.Publish(context.Background(), &pubsub.Message{Data: []byte("x"),
		Attributes: map[string]string{"event_id": "1", "occurred_at": "soon"}}).Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	good, err := e.pub.Publish(context.Background(), &pubsub.Message{Data: []byte("y"),
		Attributes: map[string]string{"event_id": "2", "occurred_at": fmt.Sprint(time.Now().UnixMilli())}}).Get(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "both settled", func() bool { n := d.Counts(); return n.Emitted+n.DeadLettered == 2 })
	if reason := rj.get(bad); !errors.Is(reason, dedup.ErrTimestampMalformed) {
		t.Errorf("OnReject reason for the malformed timestamp: %v", reason)
	}
	if rj.get(good) != nil {
		t.Error("the well-formed message went to OnReject")
	}
	eventually(t, "both acked", func() bool { return e.srv.Message(bad).Acks == 1 && e.srv.Message(good).Acks == 1 })
}

// A handler error wrapping ErrPermanent hands the message to OnReject
// instead of bringing it back, and releases its key.
func TestPermanentHandlerError(t *testing.T) {
	e := newEnv(t, "pstest")
	var rj rejects
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}, OnReject: rj.take},
		func(context.Context, *pubsub.Message) error {
			return fmt.Errorf("field total: %w", consumer.ErrPermanent)
		})
	e.receive(nil, d.Handle)
	id := e.publish("x", "k")
	eventually(t, "dead-lettered", func() bool { return d.Counts().DeadLettered == 1 })
	if !errors.Is(rj.get(id), consumer.ErrPermanent) {
		t.Errorf("OnReject reason %v", rj.get(id))
	}
	if c := d.Counts(); c.Retried != 0 || c.Emitted != 0 {
		t.Errorf("counts %+v: want only the dead letter", c)
	}
}

// stopsWith publishes one message for d and checks that its Receive stops
// with want within 20 s, the message not acked.
func stopsWith(t *testing.T, e *env, d *consumer.Dedup, want error) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- d.Receive(context.Background(), e.c.Subscriber(e.sub)) }()
	id := e.publish("x", "k")
	select {
	case err := <-done:
		if !errors.Is(err, want) {
			t.Fatalf("Receive returned %v, want %v", err, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("Receive still running 20 s after %v; counts %+v", want, d.Counts())
	}
	if m := e.srv.Message(id); m.Acks != 0 {
		t.Error("the message was acked")
	}
}

// A sink closed while the consumer still runs can never take a write
// again: Receive stops with its error, instead of nacking every message
// for ever.
func TestClosedSinkStopsReceive(t *testing.T) {
	e := newEnv(t, "pstest")
	d := mustNew(t, mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}},
		func(context.Context, *pubsub.Message) error { return fmt.Errorf("write: %w", postgres.ErrClosed) })
	stopsWith(t, e, d, postgres.ErrClosed)
}

// refusing is a store whose server refused the credentials.
type refusing struct{ dedup.Store }

func (refusing) Claim(context.Context, dedup.Claim) (dedup.Verdict, error) {
	return dedup.Verdict{}, fmt.Errorf("WRONGPASS invalid username-password pair: %w", dedup.ErrFatal)
}

// An error that retrying cannot fix stops the wrapper: the message is
// nacked, not handled, Ready turns false and Receive returns the cause
// instead of nacking forever.
func TestFatalStoreErrorStopsReceive(t *testing.T) {
	e := newEnv(t, "pstest")
	handled := false
	d := mustNew(t, refusing{mem.New()}, consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}},
		func(context.Context, *pubsub.Message) error { handled = true; return nil })
	stopsWith(t, e, d, dedup.ErrFatal)
	if handled || d.Ready() || d.Err() == nil {
		t.Errorf("handled %v, ready %v, err %v: want not handled, not ready, the error", handled, d.Ready(), d.Err())
	}
}
