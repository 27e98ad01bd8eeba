// Package sinktest measures sinks the same way, so their figures compare.
package sinktest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/sink"
)

// BenchWriteBatch writes b.N messages (a ~100-byte JSON payload each) in
// batches of 1,000, as the pipeline's batch path hands them over, and
// reports the process's CPU per message (the sink's and its client's, not
// the server's) and messages per second.
func BenchWriteBatch(b *testing.B, s sink.BatchSink) {
	// The messages are made before the clock starts: CPU per message is
	// the sink's alone.
	const batch = 1000
	now := time.Now()
	ms := make([]*sink.Message, b.N)
	for k := range ms {
		ms[k] = &sink.Message{ID: fmt.Sprint(1_000_000_000 + k), Key: fmt.Sprintf("order-%09d", k), PublishTime: now, EventTime: now,
			Data: fmt.Appendf(nil, `{"order":%d,"customer":"c-42","items":[{"sku":"A-1","qty":2}],"total":19.99}`, k)}
	}
	errs := make([]error, batch)
	b.ResetTimer()
	cpu := testenv.CPUPerOp(b)
	start := time.Now()
	for lo := 0; lo < b.N; lo += batch {
		n := min(batch, b.N-lo)
		s.WriteBatch(context.Background(), ms[lo:lo+n], errs[:n])
		for _, err := range errs[:n] {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	cpu()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
}
