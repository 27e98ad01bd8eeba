package gate

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/outcome"
	"github.com/dedupflow/dedupflow/store/mem"
)

// noObserve is a histogram that records nothing, to measure the path
// without the delay histograms.
type noObserve struct{ prometheus.Histogram }

func (noObserve) Observe(float64) {}

// BenchmarkPass is the decision path per message (memory store, a no-op
// work step, 30% republished copies), with the delay histograms that horizon
// advice reads and without them, and from many goroutines at once (as the
// client's callbacks run), in the same run:
//
//	go test -run '^$' -bench Pass ./internal/gate
func BenchmarkPass(b *testing.B) {
	for _, c := range []struct {
		name             string
		delays, parallel bool
		// fresh: each message on a goroutine of its own, as the client's
		// Receive runs its callbacks, which pays for every growth of the
		// goroutine's stack that the path's depth needs.
		fresh bool
	}{{"with-delays", true, false, false}, {"without-delays", false, false, false}, {"parallel", true, true, false},
		{"goroutine-each", true, false, true}} {
		b.Run(c.name, func(b *testing.B) {
			g, err := New(Config{Policy: dedup.Policy{IDAttribute: "key"}, Store: mem.New(),
				Work: Work{Name: "sink", Do: func(context.Context, []*Item, []error) {}, Dependency: true}})
			if err != nil {
				b.Fatal(err)
			}
			if !c.delays {
				g.m.republishDelay, g.m.redeliveryDelay = noObserve{g.m.republishDelay}, noObserve{g.m.redeliveryDelay}
			}
			now := time.Now()
			var next atomic.Int64
			pass := func() {
				// In each ten messages, seven events and three republished
				// copies of the first three.
				n := int(next.Add(1) - 1)
				g10, r := n/10, n%10
				if r >= 7 {
					r -= 7
				}
				m := &pubsub.Message{ID: strconv.Itoa(n), Data: []byte("x"), PublishTime: now,
					Attributes: map[string]string{"key": strconv.Itoa(g10*10 + r)}}
				g.Pass(b.Context(), m)
			}
			b.ReportAllocs()
			if c.parallel {
				b.SetParallelism(64)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						pass()
					}
				})
			} else {
				for b.Loop() {
					if !c.fresh {
						pass()
						continue
					}
					done := make(chan struct{})
					go func() { pass(); close(done) }()
					<-done
				}
			}
			if c := g.Counts(); c.DuplicateRepublish == 0 && next.Load() > 10 {
				b.Fatalf("no republish caught: %+v", c)
			}
		})
	}
}

// BenchmarkPassBatch is BenchmarkPass's workload (memory store, a no-op
// work step, 30% republished copies) through Pass one message at a time
// and through PassBatch in batches of 500, in the same run:
//
//	go test -run '^$' -bench PassBatch ./internal/gate
func BenchmarkPassBatch(b *testing.B) {
	for _, size := range []int{1, 500} {
		b.Run("batch="+strconv.Itoa(size), func(b *testing.B) {
			g, err := New(Config{Policy: dedup.Policy{IDAttribute: "key"}, Store: mem.New(),
				Work: Work{Name: "sink", Do: func(context.Context, []*Item, []error) {}, Dependency: true}})
			if err != nil {
				b.Fatal(err)
			}
			now := time.Now()
			msg := func(n int) *pubsub.Message {
				g10, r := n/10, n%10
				if r >= 7 {
					r -= 7
				}
				return &pubsub.Message{ID: strconv.Itoa(n), Data: []byte("x"), PublishTime: now,
					Attributes: map[string]string{"key": strconv.Itoa(g10*10 + r)}}
			}
			ms := make([]*pubsub.Message, 0, size)
			outs := make([]outcome.Result, size)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				if ms = append(ms, msg(n)); len(ms) == size {
					if size == 1 {
						g.Pass(b.Context(), ms[0])
					} else {
						g.PassBatch(b.Context(), ms, outs)
					}
					ms = ms[:0]
				}
				n++
			}
			if c := g.Counts(); c.DuplicateRepublish == 0 && n > 1000 {
				b.Fatalf("no republish caught: %+v", c)
			}
		})
	}
}

// BenchmarkPassBatchUnusable is a batch of 1,000 with distinct keys, clean
// and with 40 unusable messages (a malformed timestamp) and no Reject, in
// the same run: the unusable ones are nacked with a hold the receiver
// applies, so the batch costs what a clean one does.
//
//	go test -run '^$' -bench PassBatchUnusable ./internal/gate
func BenchmarkPassBatchUnusable(b *testing.B) {
	for _, c := range []struct {
		name  string
		every int
	}{{"clean", 0}, {"40-unusable", 25}} {
		b.Run(c.name, func(b *testing.B) {
			g, err := New(Config{Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "ts"}, Store: mem.New(),
				Work: Work{Name: "sink", Do: func(context.Context, []*Item, []error) {}}})
			if err != nil {
				b.Fatal(err)
			}
			ms := unusableBatch(1000, c.every)
			rs := make([]outcome.Result, len(ms))
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				for _, m := range ms { // new keys each time: every good message is written
					m.Attributes["key"] = strconv.Itoa(n)
					n++
				}
				g.PassBatch(b.Context(), ms, rs)
			}
			if c := g.Counts(); c.Emitted == 0 {
				b.Fatalf("nothing emitted: %+v", c)
			}
		})
	}
}
