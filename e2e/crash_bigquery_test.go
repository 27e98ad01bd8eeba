package e2e

// The BigQuery sink's crash proof, against goccy/bigquery-emulator: the
// pipeline is SIGKILLed 10 times under load and restarted each time. After,
// no key may be missing, every row must carry its key (in the key column,
// matching its attributes and payload), the extra rows a kill left must be
// no more than the kills, and the shipped view must show each key once.
//
// What the emulator can prove: rows, their columns, the lookup queries and
// the view. What it cannot: it ignores stream offsets and _CHANGE_TYPE,
// which the sink does not rely on; and its appends commit at once, as the
// _default stream's do on the service.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigquery"

	bq "github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/testenv"
	bqsink "github.com/dedupflow/dedupflow/sink/bigquery"
)

const bqCrashKills = 10

// bqCrashSize is 5,000 keys, sized for a 2-core CI (the emulator writes
// each request into SQLite), or DEDUPFLOW_CRASH_KEYS for a full run.
func bqCrashSize(t *testing.T) int {
	if os.Getenv("DEDUPFLOW_CRASH_KEYS") != "" {
		return crashSize(t)
	}
	return 5_000
}

func TestCrashSafetyBigQuery(t *testing.T) {
	t.Parallel()
	project := testenv.BigQuery(t)
	n := bqCrashSize(t)
	seed := crashSeed(t)
	e := newCrashEnv(t)
	e.createTopicSub("bq-in", "bq-in-sub")

	ctx := context.Background()
	c, err := bq.Open(ctx, project, bq.EndpointsFromEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ref := bq.TableRef{Dataset: fmt.Sprintf("crash%d", time.Now().UnixNano()), Table: "events"}
	if err := c.CreateDataset(ctx, ref.Dataset); err != nil {
		t.Fatal(err)
	}
	if err := c.CreateTable(ctx, ref, bigquery.Schema{
		{Name: "eid", Type: bigquery.StringFieldType, Required: true},
		{Name: "message_id", Type: bigquery.StringFieldType},
		{Name: "publish_time", Type: bigquery.TimestampFieldType},
		{Name: "attributes", Type: bigquery.JSONFieldType},
		{Name: "data", Type: bigquery.BytesFieldType},
		{Name: "subscription_name", Type: bigquery.StringFieldType},
	}); err != nil {
		t.Fatal(err)
	}
	table := project + "." + ref.String()
	query := func(q string) ([][]bigquery.Value, error) { return c.Query(ctx, q) }
	count := func() int {
		rows, err := query(fmt.Sprintf("SELECT COUNT(DISTINCT eid) FROM `%s`", table))
		if err != nil {
			return 0
		}
		return int(rows[0][0].(int64))
	}

	keys := crashKeys(n, "bq")
	p := crashPipeline(e, "bq-in-sub", "--sink", "bigquery://"+project+"/"+ref.Dataset, "--table", ref.Table)
	start := time.Now()
	wait := publishInBackground(e, "bq-in", keys, seed)
	seeks := crashLoop(t, e, p, bqCrashKills, "bq-in-sub", start.Add(-time.Second), rand.New(rand.NewPCG(seed, 2)), count)
	lastKill := time.Now()
	pub := wait()
	t.Logf("%v; %d kills, %d seeks back to the start, in %v", pub, bqCrashKills, seeks, time.Since(start).Round(time.Millisecond))

	// Done when every key is in, the claim lease of the last killed run
	// (30 s) has passed, so a key it held has been taken over and written,
	// and the rows have not changed for 5 s.
	last, lastChange := -1, time.Now()
	await(t, 6*time.Minute, func() (bool, string) {
		rows, err := query(fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT eid) FROM `%s`", table))
		if err != nil {
			return false, err.Error()
		}
		all, distinct := int(rows[0][0].(int64)), int(rows[0][1].(int64))
		if all != last {
			last, lastChange = all, time.Now()
		}
		return distinct >= n && time.Since(lastKill) > 40*time.Second && time.Since(lastChange) > 5*time.Second,
			fmt.Sprintf("the table has %d of %d keys", distinct, n)
	}, p)
	p.stop()

	rows, err := query(fmt.Sprintf("SELECT eid, message_id, JSON_VALUE(attributes, '$.eid'), SAFE_CONVERT_BYTES_TO_STRING(data) FROM `%s`", table))
	if err != nil {
		t.Fatal(err)
	}
	perKey := map[string]int{}
	var unexpected, unkeyed []string
	for _, r := range rows {
		k, _ := r[0].(string)
		perKey[k]++
		ids, ok := pub.ids[k]
		switch {
		case !ok:
			unexpected = append(unexpected, k)
		case r[2] != k || r[3] != "payload-"+k || !slices.Contains(ids, r[1].(string)):
			unkeyed = append(unkeyed, fmt.Sprint(r))
		}
	}
	var missing []string
	extraKeys := 0
	for _, k := range keys {
		switch perKey[k] {
		case 0:
			missing = append(missing, k)
		case 1:
		default:
			extraKeys++
		}
	}
	extras := len(rows) - len(perKey)
	view, err := query(fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT eid) FROM (%s)", bqsink.DedupView(table, "eid", "publish_time")))
	if err != nil {
		t.Fatalf("the shipped view: %v", err)
	}
	t.Logf("table: %d rows for %d keys; missing %d, unexpected %d, extra rows %d on %d keys after %d kills (%.2f per kill); the view shows %v rows, %v keys",
		len(rows), len(perKey), len(missing), len(unexpected), extras, extraKeys, bqCrashKills, float64(extras)/bqCrashKills, view[0][0], view[0][1])
	for what, list := range map[string][]string{"missing": missing, "never published": unexpected, "whose row does not carry its key, its payload and a message ID published for it": unkeyed} {
		if len(list) > 0 {
			t.Errorf("%d keys %s, e.g. %s", len(list), what, strings.Join(list[:min(5, len(list))], ", "))
		}
	}
	if extras > bqCrashKills {
		t.Errorf("%d extra rows after %d kills: more than one per kill", extras, bqCrashKills)
	}
	if view[0][0] != int64(n) || view[0][1] != int64(n) {
		t.Errorf("the view shows %v rows for %v keys, want %d of each", view[0][0], view[0][1], n)
	}
}
