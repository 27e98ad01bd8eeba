package gate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// noObserve is a histogram that records nothing, to measure the path
// without the delay histograms.
type noObserve struct{ prometheus.Histogram }

func (noObserve) Observe(float64) {}

// BenchmarkPass is the decision path per message (memory store, a no-op
// work step, 30% republished copies), with the delay histograms that horizon
// advice reads and without them, in the same run:
//
//	go test -run '^$' -bench Pass ./internal/gate
func BenchmarkPass(b *testing.B) {
	for _, delays := range []bool{true, false} {
		b.Run(map[bool]string{true: "with-delays", false: "without-delays"}[delays], func(b *testing.B) {
			dd, err := dedup.New(mem.New(), dedup.Options{})
			if err != nil {
				b.Fatal(err)
			}
			g, err := New(Config{Rule: dedup.Rule{IDAttribute: "key"}, Deduper: dd,
				Work: Work{Name: "sink", Do: func(context.Context, *Item) error { return nil }}})
			if err != nil {
				b.Fatal(err)
			}
			if !delays {
				g.m.republishDelay, g.m.redeliveryDelay = noObserve{g.m.republishDelay}, noObserve{g.m.redeliveryDelay}
			}
			now := time.Now()
			n := 0
			b.ReportAllocs()
			for b.Loop() {
				// In each ten messages, seven events and three republished
				// copies of the first three.
				g10, r := n/10, n%10
				if r >= 7 {
					r -= 7
				}
				m := &pubsub.Message{ID: fmt.Sprint(n), Data: []byte("x"), PublishTime: now,
					Attributes: map[string]string{"key": fmt.Sprint(g10*10 + r)}}
				g.Pass(b.Context(), m)
				n++
			}
			if c := g.Counts(); c.DuplicateRepublish == 0 && n > 10 {
				b.Fatalf("no republish caught: %+v", c)
			}
		})
	}
}
