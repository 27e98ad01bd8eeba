package topic

import (
	"context"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// BenchmarkWriteBatch measures the topic sink as the table sinks are
// measured (internal/testenv/sinktest), for a side-by-side figure: batches
// of 1,000 messages to Google's Pub/Sub emulator, a server in another
// process, so cpu-ns/op is the sink's CPU per message alone. Run with
//
//	go test -run '^$' -bench WriteBatch -benchtime 50000x ./sink/topic/
func BenchmarkWriteBatch(b *testing.B) {
	addr := testenv.EmulatorHost(b)
	ctx := context.Background()
	c, err := pubsubio.NewClient(ctx, "p", pubsubio.Insecure(addr)...)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	top := pubsubio.Name{Project: "p", Kind: "topics", ID: "bench-out"}
	if err := pubsubio.EnsureTopic(ctx, c, top); err != nil {
		b.Fatal(err)
	}
	s := New(c, top, 30*time.Second)
	defer s.Stop()
	sinktest.BenchWriteBatch(b, s)
}
