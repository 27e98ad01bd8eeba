package spanner

import (
	"context"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/internal/testenv/spannertest"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// BenchmarkWriteBatch writes batches of 1,000 messages, two fields of
// their JSON payload and three metadata columns each. b.N is messages;
// cpu-ns/op is the sink's CPU per message, not the emulator's. Run with
//
//	go test -run '^$' -bench WriteBatch -benchtime 50000x ./sink/spanner/
func BenchmarkWriteBatch(b *testing.B) {
	db := spannertest.Database(b, `CREATE TABLE orders (eid STRING(MAX) NOT NULL, message_id STRING(MAX),
		publish_time TIMESTAMP, customer STRING(MAX), total FLOAT64) PRIMARY KEY (eid)`)
	md, _ := columns.Parse("key,message_id,publish_time", "eid")
	s, err := Open(context.Background(), "spanner://"+db, Options{Table: "orders", Metadata: md})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	sinktest.BenchWriteBatch(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Rows)/float64(max(st.Commits, 1)), "rows/commit")
}
