package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/postgres"
)

// BenchmarkInsert compares the sink with the fastest plain pgx loop we
// know — one unnest statement per 500 rows, same columns, same payload, one
// connection — on the same server in the same run. The machine is shared,
// so the two are measured in alternating rounds of 10,000 rows, each side
// in a fresh table: both see the same load. b.N is the rows per side.
// Metrics: rows/s of each and their ratio (target ≥ 0.7). Run with
//
//	go test -run '^$' -bench Insert -benchtime 100000x ./sink/postgres/
func BenchmarkInsert(b *testing.B) {
	for _, writers := range []int{1000, 100} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) {
			e := newEnv(b)
			plainTable := e.table + "_plain"
			b.Cleanup(func() {
				_, _ = e.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{plainTable}.Sanitize())
			})
			p := newPlain(b, e, plainTable)
			s := e.open(b, postgres.Options{})
			const round = 10_000
			var plainT, sinkT time.Duration
			for lo := 0; lo < b.N; lo += round {
				n := min(round, b.N-lo)
				plainT += p.insert(b, lo, n)
				sinkT += sinkRound(b, s, writers, lo, n)
			}
			st := s.Stats()
			plainRate, sinkRate := float64(b.N)/plainT.Seconds(), float64(b.N)/sinkT.Seconds()
			b.ReportMetric(plainRate, "plain-rows/s")
			b.ReportMetric(sinkRate, "sink-rows/s")
			b.ReportMetric(sinkRate/plainRate, "sink/plain")
			b.ReportMetric(float64(st.Rows)/float64(max(st.Batches, 1)), "rows/stmt")
			b.ReportMetric(0, "ns/op")
		})
	}
}

var benchData = []byte(`{"order":12345,"customer":"c-42","items":[{"sku":"A-1","qty":2}],"total":19.99}`)

func benchMessage(i int, now time.Time) *sink.Message {
	key := fmt.Sprintf("order-%09d", i)
	return &sink.Message{
		ID: fmt.Sprint(1_000_000_000 + i), Key: key, Data: benchData,
		Attributes:  map[string]string{"dedupflow_id": key, "producer": "web-1"},
		PublishTime: now, EventTime: now,
	}
}

// sinkRound writes rows [lo, lo+n) through s from writers goroutines, as
// the pipeline's message handlers do.
func sinkRound(b *testing.B, s *postgres.Sink, writers, lo, n int) time.Duration {
	now := time.Now()
	msgs := make([]*sink.Message, n)
	for i := range msgs {
		msgs[i] = benchMessage(lo+i, now)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				if err := s.Write(context.Background(), msgs[i]); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(start)
}

// plain is the hand-written loop: 500 rows per statement on one connection.
type plain struct {
	conn *pgxpool.Pool
	stmt string
}

func newPlain(b *testing.B, e *env, table string) *plain {
	// The sink makes the table, so both write the same shape.
	s, err := postgres.Open(context.Background(), e.url, postgres.Options{Table: table})
	if err != nil {
		b.Fatal(err)
	}
	s.Close()
	cfg, err := pgxpool.ParseConfig(e.url)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	return &plain{conn: pool, stmt: "INSERT INTO " + pgx.Identifier{table}.Sanitize() + ` (key, message_id, data, data_json, attributes, event_time, publish_time)
SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::jsonb[], $6::timestamptz[], $7::timestamptz[])
ON CONFLICT (key) DO NOTHING`}
}

// insert writes rows [lo, lo+n); the time counts building the arrays
// (encoding attributes as JSON), as the sink's does.
func (p *plain) insert(b *testing.B, lo, n int) time.Duration {
	now := time.Now()
	msgs := make([]*sink.Message, n)
	for i := range msgs {
		msgs[i] = benchMessage(lo+i, now)
	}
	start := time.Now()
	for off := 0; off < n; off += 500 {
		k := min(500, n-off)
		keys, ids := make([]string, k), make([]string, k)
		data, dj, attrs := make([][]byte, k), make([]json.RawMessage, k), make([]json.RawMessage, k)
		ev, pub := make([]time.Time, k), make([]time.Time, k)
		for j := range k {
			m := msgs[off+j]
			a, _ := json.Marshal(m.Attributes)
			keys[j], ids[j], data[j], dj[j], attrs[j], ev[j], pub[j] = m.Key, m.ID, m.Data, m.Data, a, m.EventTime, m.PublishTime
		}
		if _, err := p.conn.Exec(context.Background(), p.stmt, keys, ids, data, dj, attrs, ev, pub); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}
