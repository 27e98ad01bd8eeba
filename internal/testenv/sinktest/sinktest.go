// Package sinktest measures sinks the same way, so their figures compare.
package sinktest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
	ms := messages(b.N)
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

// Writers is how many goroutines BenchWriteConcurrent writes from, as a
// receiver that hands over one message at a time runs many handlers.
const Writers = 64

// BenchWriteConcurrent writes b.N messages (as BenchWriteBatch's) one
// Write each, from Writers goroutines at once, and reports the same
// figures.
func BenchWriteConcurrent(b *testing.B, s sink.Sink) {
	ms := messages(b.N)
	b.ResetTimer()
	cpu := testenv.CPUPerOp(b)
	start := time.Now()
	for i, err := range WriteEach(context.Background(), s, ms, Writers) {
		if err != nil {
			b.Fatalf("message %d: %v", i, err)
		}
	}
	cpu()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msg/s")
}

// WriteEach writes every ms[i] with a Write of its own, from writers
// goroutines at once, and returns each one's error.
func WriteEach(ctx context.Context, s sink.Sink, ms []*sink.Message, writers int) []error {
	errs := make([]error, len(ms))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(ms); i = int(next.Add(1) - 1) {
				errs[i] = s.Write(ctx, ms[i])
			}
		})
	}
	wg.Wait()
	return errs
}

// messages are n orders, each with a ~100-byte JSON payload.
func messages(n int) []*sink.Message {
	now := time.Now()
	ms := make([]*sink.Message, n)
	for k := range ms {
		ms[k] = &sink.Message{ID: fmt.Sprint(1_000_000_000 + k), Key: fmt.Sprintf("order-%09d", k), PublishTime: now, EventTime: now,
			Data: fmt.Appendf(nil, `{"order":%d,"customer":"c-42","items":[{"sku":"A-1","qty":2}],"total":19.99}`, k)}
	}
	return ms
}
