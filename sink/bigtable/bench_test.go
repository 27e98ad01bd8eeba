package bigtable

import (
	"context"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv/bigtabletest"
	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// BenchmarkWriteBatch writes batches of 1,000 messages, two fields of
// their JSON payload and three metadata columns each. b.N is messages;
// cpu-ns/op is the sink's CPU per message, not the emulator's. Run with
//
//	go test -run '^$' -bench WriteBatch -benchtime 50000x ./sink/bigtable/
func BenchmarkWriteBatch(b *testing.B) {
	table := bigtabletest.Table(b, DefaultFamily)
	md, _ := columns.Parse("key,message_id,publish_time", "eid")
	s, err := Open(context.Background(), bigtabletest.URL, Options{Table: table, Metadata: md, Fields: []string{"customer", "total"}})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	sinktest.BenchWriteBatch(b, s)
	st := s.Stats()
	b.ReportMetric(float64(st.Rows)/float64(max(st.Requests, 1)), "rows/request")
}
