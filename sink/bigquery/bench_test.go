package bigquery

import (
	"fmt"
	"testing"

	"github.com/dedupflow/dedupflow/sink"
)

// BenchmarkWriteBatch writes batches of 1,000 orders; with Retaken, each
// batch first looks its keys up, as after a restart. Against the emulator
// it measures the emulator as much as the sink: its figures compare the
// two paths, they do not predict the service.
func BenchmarkWriteBatch(b *testing.B) {
	for _, retaken := range []bool{false, true} {
		b.Run(fmt.Sprintf("retaken=%v", retaken), func(b *testing.B) {
			f := newFixture(b)
			f.table(b, "orders", orders)
			s := f.open(b, Options{Table: "orders"})
			const n = 1000
			b.ResetTimer()
			for i := range b.N {
				ms := make([]*sink.Message, n)
				for j := range ms {
					ms[j] = order(i*n + j)
					ms[j].Retaken = retaken
				}
				for _, err := range writeAll(b, s, ms) {
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/msg")
		})
	}
}
