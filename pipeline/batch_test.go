package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/pubsubio/pull"
)

// TestHandleBatch: a batch with copies within it and of an earlier batch
// writes each key once to the output topic, carrying its key, and gives
// every message the outcome Handle would.
func TestHandleBatch(t *testing.T) {
	r := newRig(t, pubsubio.Insecure(brokertest.Start(t)), rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
	batch := func(specs ...[2]string) []pipeline.Outcome {
		ms := make([]*pubsub.Message, len(specs))
		for i, s := range specs {
			ms[i] = &pubsub.Message{ID: s[0], Data: []byte(s[0]), PublishTime: time.Now(), Attributes: map[string]string{"key": s[1]}}
		}
		rs := make([]pipeline.Result, len(ms))
		r.p.HandleBatch(context.Background(), ms, rs)
		outs := make([]pipeline.Outcome, len(rs))
		for i := range rs {
			outs[i] = rs[i].Outcome
		}
		return outs
	}
	outs := batch([2]string{"1", "a"}, [2]string{"2", "b"}, [2]string{"3", "a"}, [2]string{"4", "c"})
	if want := fmt.Sprint([]pipeline.Outcome{pipeline.Emitted, pipeline.Emitted, pipeline.DuplicateRepublish, pipeline.Emitted}); fmt.Sprint(outs) != want {
		t.Fatalf("first batch: %v, want %v", outs, want)
	}
	outs = batch([2]string{"1", "a"}, [2]string{"5", "b"}, [2]string{"6", "d"})
	if want := fmt.Sprint([]pipeline.Outcome{pipeline.DuplicateRedelivery, pipeline.DuplicateRepublish, pipeline.Emitted}); fmt.Sprint(outs) != want {
		t.Fatalf("second batch: %v, want %v", outs, want)
	}
	out := r.drain(r.outSub, 4, 300*time.Millisecond)
	if d := fmt.Sprint(datas(out)); d != "[1 2 4 6]" {
		t.Fatalf("output %s, want 1, 2, 4 and 6 once each", d)
	}
	keys := map[string]string{"1": "a", "2": "b", "4": "c", "6": "d"}
	for _, g := range out {
		if g.attrs["key"] != keys[g.data] {
			t.Errorf("output %s carries key %q, want %q", g.data, g.attrs["key"], keys[g.data])
		}
	}
}

// TestRunBatch: the batch path end to end on our broker and Google's
// emulator: published events and republished copies come out once per
// key, carrying it, and every input is acked.
func TestRunBatch(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		r := newRig(t, pubsubio.Insecure(host), rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
		in, err := pull.New(r.c.SubscriptionAdminClient, r.inSub.String(), pull.Options{Streams: 2})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.p.RunBatch(ctx, in) }()
		const keys = 200
		total := int64(0)
		for i := range keys {
			for range 1 + i%3 { // a third of the keys once, a third twice, a third three times
				r.publish(fmt.Sprint(i), map[string]string{"key": fmt.Sprint("k", i)})
				total++
			}
		}
		c := r.waitCounts("every message", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == total })
		if c.Emitted != keys || c.Retried != 0 {
			t.Errorf("counts %+v: want %d emitted, none retried", c, keys)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		out := r.drain(r.outSub, keys, 300*time.Millisecond)
		seen := map[string]int{}
		for _, g := range out {
			seen[g.attrs["key"]]++
		}
		if len(seen) != keys || len(out) != keys {
			t.Fatalf("%d outputs for %d keys, want %d once each", len(out), len(seen), keys)
		}
		if st := in.Stats(); st.Acked != total {
			t.Errorf("receiver %+v: want all %d inputs acked", st, total)
		}
	})
}
