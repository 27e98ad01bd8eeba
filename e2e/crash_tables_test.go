package e2e

// The crash-safety proof of the Spanner and Bigtable sinks, against
// Google's emulators: the pipeline is SIGKILLed 10 times while it writes,
// and the table must end up with every published key once, in one row
// (Spanner) or one cell per column (Bigtable), each holding the message ID
// of one of the key's copies.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigtable"
	"cloud.google.com/go/spanner"

	"github.com/dedupflow/dedupflow/internal/testenv/bigtabletest"
	"github.com/dedupflow/dedupflow/internal/testenv/spannertest"
)

// tableKills is the kills of each table sink's proof.
const tableKills = 10

// crashIntoTable runs the kill loop (kills kills) with the pipeline
// writing n keys to sinkArgs, until count reports every key landed; it
// returns the keys and what was published for them.
func crashIntoTable(t *testing.T, kills, n int, prefix string, sinkArgs []string, count func() int) ([]string, *published) {
	seed := crashSeed(t)
	e := newCrashEnv(t)
	e.createTopicSub("crash-in", "crash-in-sub")
	keys := crashKeys(n, prefix)
	p := crashPipeline(e, "crash-in-sub", sinkArgs...)
	start := time.Now()
	wait := publishInBackground(e, "crash-in", keys, seed)
	seeks := crashLoop(t, e, p, kills, "crash-in-sub", start.Add(-time.Second), rand.New(rand.NewPCG(seed, 2)), count)
	pub := wait()
	t.Logf("%v; %d kills, %d seeks back to the start, in %v", pub, kills, seeks, time.Since(start).Round(time.Millisecond))
	await(t, 6*time.Minute, func() (bool, string) {
		c := count()
		return c >= n, fmt.Sprintf("the table has %d of %d keys", c, n)
	}, p)
	t.Logf("all %d keys in the table %v after the start", n, time.Since(start).Round(time.Millisecond))
	// Let late redeliveries and copies arrive: they must change nothing.
	time.Sleep(5 * time.Second)
	p.stop()
	return keys, pub
}

// checkLanded asserts that ids (a key's message IDs as the table holds
// them: one per row, or per cell) has every key once, each with the ID of
// one of its published copies, and no other key.
func checkLanded(t *testing.T, what string, keys []string, pub *published, ids map[string][]string) {
	t.Helper()
	var missing, unexpected, twice, wrongID []string
	for k, got := range ids {
		want, ok := pub.ids[k]
		switch {
		case !ok:
			unexpected = append(unexpected, k)
		case len(got) > 1:
			twice = append(twice, fmt.Sprintf("%s=%v", k, got))
		case !slices.Contains(want, got[0]):
			wrongID = append(wrongID, fmt.Sprintf("%s=%s (published as %v)", k, got[0], want))
		}
	}
	for _, k := range keys {
		if _, ok := ids[k]; !ok {
			missing = append(missing, k)
		}
	}
	t.Logf("%s: %d keys, %d expected; missing %d, unexpected %d, twice %d, foreign message ID %d",
		what, len(ids), len(keys), len(missing), len(unexpected), len(twice), len(wrongID))
	for what, list := range map[string][]string{"missing": missing, "unexpected": unexpected, "twice": twice, "with a message ID never published for the key": wrongID} {
		if len(list) > 0 {
			sort.Strings(list)
			t.Errorf("%d keys %s, e.g. %s", len(list), what, strings.Join(list[:min(5, len(list))], ", "))
		}
	}
}

func TestCrashSafetySpanner(t *testing.T) {
	t.Parallel()
	db := spannertest.Database(t, `CREATE TABLE crash (eid STRING(MAX) NOT NULL, message_id STRING(MAX) NOT NULL,
		publish_time TIMESTAMP NOT NULL, data BYTES(MAX)) PRIMARY KEY (eid)`)
	c, err := spanner.NewClient(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	query := func(sql string, f func(*spanner.Row) error) error {
		return c.Single().Query(context.Background(), spanner.NewStatement(sql)).Do(f)
	}
	count := func() int {
		var n int64
		if err := query("SELECT COUNT(*) FROM crash", func(r *spanner.Row) error { return r.Columns(&n) }); err != nil {
			t.Logf("count: %v", err)
		}
		return int(n)
	}
	// The emulator commits about 300 rows a second on 2 busy cores: with
	// -short, a quarter of the keys keeps the proof within a minute.
	n := crashSize(t)
	if testing.Short() {
		n /= 4
	}
	keys, pub := crashIntoTable(t, tableKills, n, "sp", []string{"--sink", "spanner://" + db, "--table", "crash",
		"--metadata-columns", "key,message_id,publish_time,data"}, count)
	ids := map[string][]string{}
	err = query("SELECT eid, message_id FROM crash", func(r *spanner.Row) error {
		var k, id string
		err := r.Columns(&k, &id)
		ids[k] = append(ids[k], id)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checkLanded(t, "spanner rows", keys, pub, ids)
}

func TestCrashSafetyBigtable(t *testing.T) {
	t.Parallel()
	table := bigtabletest.Table(t, "cf")
	c, err := bigtable.NewClient(context.Background(), bigtabletest.Project, bigtabletest.Instance)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tbl := c.Open(table)
	count := func() int {
		n := 0
		err := tbl.ReadRows(context.Background(), bigtable.InfiniteRange(""), func(bigtable.Row) bool { n++; return true },
			bigtable.RowFilter(bigtable.ChainFilters(bigtable.CellsPerRowLimitFilter(1), bigtable.StripValueFilter())))
		if err != nil {
			t.Logf("count: %v", err)
		}
		return n
	}
	keys, pub := crashIntoTable(t, tableKills, crashSize(t), "bt", []string{"--sink", bigtabletest.URL, "--table", table,
		"--metadata-columns", "key,message_id,publish_time,data"}, count)
	// Every cell of every column: a column with two cells is a key written
	// twice, even when both hold the same message ID.
	ids := map[string][]string{}
	cells, extra := 0, 0
	err = tbl.ReadRows(context.Background(), bigtable.InfiniteRange(""), func(r bigtable.Row) bool {
		per := map[string]int{}
		for _, it := range r["cf"] {
			cells++
			if per[it.Column]++; per[it.Column] > 1 {
				extra++
			}
			if it.Column == "cf:message_id" {
				ids[r.Key()] = append(ids[r.Key()], string(it.Value))
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bigtable: %d rows, %d cells, %d cells beyond the first of their column", len(ids), cells, extra)
	if extra > 0 {
		t.Errorf("%d cells beyond the first of their column: a rewrite added a cell", extra)
	}
	checkLanded(t, "bigtable rows", keys, pub, ids)
}
