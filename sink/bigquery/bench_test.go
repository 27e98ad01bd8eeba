package bigquery

import (
	"testing"

	"cloud.google.com/go/bigquery"

	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// benchSink writes two fields of the JSON payload and three metadata
// columns of each message, as the other table sinks' benchmarks do.
func benchSink(b *testing.B) *Sink {
	f := newFixture(b)
	f.table(b, "orders", bigquery.Schema{
		{Name: "eid", Type: bigquery.StringFieldType}, {Name: "message_id", Type: bigquery.StringFieldType},
		{Name: "publish_time", Type: bigquery.TimestampFieldType},
		{Name: "customer", Type: bigquery.StringFieldType}, {Name: "total", Type: bigquery.FloatFieldType},
	})
	md, _ := columns.Parse("key,message_id,publish_time", "eid")
	return f.open(b, Options{Table: "orders", Metadata: md})
}

// BenchmarkWriteBatch writes batches of 1,000 messages. b.N is messages;
// cpu-ns/op is the sink's CPU per message, not the emulator's. Run with
//
//	go test -run '^$' -bench 'WriteBatch$' -benchtime 20000x ./sink/bigquery/
func BenchmarkWriteBatch(b *testing.B) {
	sinktest.BenchWriteBatch(b, benchSink(b))
}

// BenchmarkWriteConcurrent writes each message with a Write of its own,
// from many goroutines at once, as a receiver that hands over one message
// at a time does. Run with
//
//	go test -run '^$' -bench WriteConcurrent -benchtime 5000x ./sink/bigquery/
func BenchmarkWriteConcurrent(b *testing.B) {
	s := benchSink(b)
	sinktest.BenchWriteConcurrent(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Appended)/float64(max(st.Appends, 1)), "rows/append")
}

// BenchmarkWriteBatchRetaken writes batches of 1,000 retaken orders, each
// batch looked up first, as after a restart. On the emulator the look-up
// dominates: the figure compares the two paths there, it does not predict
// the service.
func BenchmarkWriteBatchRetaken(b *testing.B) {
	f := newFixture(b)
	f.table(b, "orders", orders)
	s := f.open(b, Options{Table: "orders"})
	const n = 1000
	b.ResetTimer()
	for i := range b.N {
		ms := make([]*sink.Message, n)
		for j := range ms {
			ms[j] = order(i*n + j)
			ms[j].Retaken = true
		}
		for _, err := range writeAll(b, s, ms) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/msg")
}
