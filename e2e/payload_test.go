package e2e

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/jackc/pgx/v5"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// --max-outstanding-bytes bounds what a pipeline holds when its sink is
// stuck: with 5 MB messages and a bound of 12 MB, a pipeline whose
// database table is locked takes no more than a few of the 30 messages
// waiting (150 MB), not all of them; once the lock goes, every message is
// written once.
func TestMaxOutstandingBytes(t *testing.T) {
	t.Parallel()
	pgURL := testenv.PostgresURL(t)
	e := newCrashEnv(t)
	ctx := context.Background()
	e.createTopicSub("input", "in-sub")
	st := newSinkTable(t, pgURL, "large")
	db, table := st.db, st.name
	p := &pipelineProc{e: e, args: []string{"pipeline",
		"--input-subscription", e.sub("in-sub"), "--id-attribute", "eid", "--sink", pgURL, "--table", table,
		"--max-outstanding-bytes", strconv.Itoa(12 << 20), "--metrics-addr", "127.0.0.1:0", "--log-format", "json"}}
	p.start()
	base := p.metricsBase(t) // the table exists once the pipeline serves
	lock, err := db.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A failed test still lets go of the table, or the cleanup that drops
	// it (registered before, so run after) waits on the lock for ever.
	t.Cleanup(func() { _ = lock.Rollback(context.Background()) })
	if _, err := lock.Exec(ctx, "LOCK TABLE "+pgx.Identifier{table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	pub := e.client.Publisher(e.topic("input"))
	const n, size = 30, 5 << 20
	payload := bytes.Repeat([]byte("x"), size)
	// Published while the watch below runs: it must see the pipeline's
	// first seconds with the sink stuck, before the first write times out
	// and its message comes back (counted as received again), however long
	// 150 MB take to publish on a loaded machine.
	published := make(chan error, 1)
	go func() {
		defer pub.Stop()
		for i := range n {
			if _, err := pub.Publish(ctx, &pubsub.Message{Data: payload, Attributes: map[string]string{"eid": fmt.Sprint(i)}}).Get(ctx); err != nil {
				published <- err
				return
			}
		}
		published <- nil
	}()
	received := func() float64 {
		m, err := testenv.Scrape(base)
		if err != nil {
			t.Fatal(err)
		}
		return m["dedupflow_received_total"]
	}
	// Once the pipeline holds its first messages, it takes no more while
	// the sink is stuck: watch it for a few seconds.
	for deadline := time.Now().Add(90 * time.Second); received() == 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nothing received within 90 s\n%s", p.tail())
		}
	}
	most := 0.0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		most = max(most, received())
	}
	if most > 4 {
		t.Errorf("the pipeline took %v messages of 5 MB while its sink was stuck; --max-outstanding-bytes 12 MiB allows 2 or 3", most)
	}
	if err := <-published; err != nil {
		t.Fatal(err)
	}
	if err := lock.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(90 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		var rows int
		if err := db.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()).Scan(&rows); err != nil {
			t.Fatal(err)
		}
		if rows == n {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rows written within 90 s of the lock's release\n%s", rows, n, p.tail())
		}
	}
	p.stop()
	t.Logf("held at most %v messages of 5 MB while the sink was stuck", most)
}
