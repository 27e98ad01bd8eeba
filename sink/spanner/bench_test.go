package spanner

import (
	"context"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/internal/testenv/spannertest"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// benchSink writes two fields of the JSON payload and three metadata
// columns of each message.
func benchSink(b *testing.B) *Sink {
	db := spannertest.Database(b, `CREATE TABLE orders (eid STRING(MAX) NOT NULL, message_id STRING(MAX),
		publish_time TIMESTAMP, customer STRING(MAX), total FLOAT64) PRIMARY KEY (eid)`)
	md, _ := columns.Parse("key,message_id,publish_time", "eid")
	s, err := Open(context.Background(), "spanner://"+db, Options{Table: "orders", Metadata: md})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	return s
}

// BenchmarkWriteBatch writes batches of 1,000 messages. b.N is messages;
// cpu-ns/op is the sink's CPU per message, not the emulator's. Run with
//
//	go test -run '^$' -bench WriteBatch -benchtime 50000x ./sink/spanner/
func BenchmarkWriteBatch(b *testing.B) {
	s := benchSink(b)
	sinktest.BenchWriteBatch(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Rows)/float64(max(st.Commits, 1)), "rows/commit")
}

// BenchmarkWriteConcurrent writes each message with a Write of its own,
// from many goroutines at once, as a receiver that hands over one message
// at a time does. Run with
//
//	go test -run '^$' -bench WriteConcurrent -benchtime 5000x ./sink/spanner/
func BenchmarkWriteConcurrent(b *testing.B) {
	s := benchSink(b)
	sinktest.BenchWriteConcurrent(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Rows)/float64(max(st.Commits, 1)), "rows/commit")
}
