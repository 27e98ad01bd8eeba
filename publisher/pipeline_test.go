package publisher_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink/topic"
	"github.com/dedupflow/dedupflow/store/mem"
)

// End to end: a publish whose first response is lost after the server
// stored it leaves two copies on the input topic; the dedup pipeline, keyed
// on the publisher's attribute, emits the event once and counts the other
// copy as a republish.
func TestPipelineEmitsRetriedEventOnce(t *testing.T) {
	srv, _, addr := newLossy(t, 1)
	ctx := context.Background()
	// The producer talks to the lossy front; the pipeline to the server.
	producer := newClient(t, addr, false)
	c := newClient(t, srv.Addr, true)
	in, pub := newTopic(t, producer)
	out, _ := newTopic(t, c)
	inSub := pubsubio.Name{Project: project, Kind: "subscriptions", ID: in.ID + "-sub"}
	outSub := pubsubio.Name{Project: project, Kind: "subscriptions", ID: out.ID + "-sub"}
	for _, s := range [][2]pubsubio.Name{{inSub, in}, {outSub, out}} {
		if err := pubsubio.EnsureSubscription(ctx, c, s[0], s[1], 10); err != nil {
			t.Fatal(err)
		}
	}

	sink := topic.New(c, out, 5*time.Second)
	t.Cleanup(sink.Stop)
	pl, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: publisher.DefaultIDAttribute}},
		pipeline.Deps{Store: mem.New(), Sink: sink, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- pl.Run(runCtx, c.Subscriber(inSub.String())) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v", err)
		}
	})

	var sl sleeps
	p, err := publisher.New(pub, publisher.Options{Sleep: sl.Sleep})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Publish(ctx, publisher.Event{Key: "order-123", Data: []byte("paid")})
	if _, err := r.Get(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(stored(srv, in)); n != 2 || r.Attempts() != 2 {
		t.Fatalf("%d copies on the input after %d attempts, want 2 and 2", n, r.Attempts())
	}

	deadline := time.Now().Add(30 * time.Second)
	for {
		cn := pl.Counts()
		if cn.Emitted+cn.DuplicateRepublish >= 2 {
			if cn.Emitted != 1 || cn.DuplicateRepublish != 1 || cn.DuplicateRedelivery != 0 {
				t.Fatalf("counts %+v, want 1 emitted and 1 republish", cn)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline did not handle both copies: %+v", cn)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// The output holds the event once, with its key.
	var mu sync.Mutex
	var got []*pubsub.Message
	rctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	err = c.Subscriber(outSub.String()).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		m.Ack()
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Attributes[publisher.DefaultIDAttribute] != "order-123" || string(got[0].Data) != "paid" {
		t.Fatalf("output %d messages (%v), want the event once", len(got), got)
	}
}
