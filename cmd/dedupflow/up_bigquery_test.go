package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	gbq "cloud.google.com/go/bigquery"
	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestUpBigQuery: with --bigquery-table the tutorial ends in a table: a
// message published twice with one key reaches it once, as the pipeline
// passed it on, with its metadata.
func TestUpBigQuery(t *testing.T) {
	project := testenv.BigQuery(t)
	ctx := context.Background()
	bq, err := bigquery.Open(ctx, project, bigquery.EndpointsFromEnv())
	if err != nil {
		t.Fatal(err)
	}
	defer bq.Close()
	ds := fmt.Sprintf("up%d", time.Now().UnixNano())
	if err := bq.CreateDataset(ctx, ds); err != nil {
		t.Fatal(err)
	}
	if err := bq.CreateTable(ctx, bigquery.TableRef{Dataset: ds, Table: "deduped"}, gbq.Schema{
		{Name: "data", Type: gbq.StringFieldType}, {Name: "subscription_name", Type: gbq.StringFieldType},
		{Name: "message_id", Type: gbq.StringFieldType}, {Name: "publish_time", Type: gbq.TimestampFieldType},
		{Name: "attributes", Type: gbq.StringFieldType}}); err != nil {
		t.Fatal(err)
	}
	table := project + "." + ds + ".deduped"
	u := startUp(t, "--bigquery-table", table)
	m := func() *pubsub.Message {
		return &pubsub.Message{Data: []byte("order 1"), Attributes: map[string]string{"key": "o-1"}}
	}
	u.publish(t, m(), m())
	q := "SELECT COUNT(*) FROM `" + table + "` WHERE data = 'order 1' AND subscription_name = 'projects/" + upDefaultProj + "/subscriptions/" + upBigQuerySub + "'"
	var n int64
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		rows, err := bq.Query(ctx, q)
		if err != nil {
			continue // the emulator refuses a query now and then while it takes appends ("database is locked")
		}
		if n = rows[0][0].(int64); n == 1 {
			break
		}
	}
	if n != 1 {
		t.Fatalf("%s = %d, want the deduped message once", q, n)
	}
}

// TestUpBigQueryNeedsEmulator: up has no Google Cloud behind it, so
// --bigquery-table without the emulator's addresses is refused before
// anything listens, not left to a subscription that only shows NOT_FOUND.
func TestUpBigQueryNeedsEmulator(t *testing.T) {
	for _, tc := range []struct{ rest, storage, want string }{
		{"", "", "--bigquery-table needs the BigQuery emulator: set $BIGQUERY_EMULATOR_HOST and $BIGQUERY_STORAGE_EMULATOR_HOST"},
		{"127.0.0.1:1", "", "--bigquery-table: $BIGQUERY_EMULATOR_HOST is set but $BIGQUERY_STORAGE_EMULATOR_HOST is not"},
	} {
		t.Setenv(bigquery.EnvREST, tc.rest)
		t.Setenv(bigquery.EnvStorage, tc.storage)
		var stdout, stderr testenv.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, []string{"up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", "",
			"--bigquery-table", "p.ds.t"}, &stdout, &stderr)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%q %s=%q: error %v, want one containing %q", bigquery.EnvREST, tc.rest, bigquery.EnvStorage, tc.storage, err, tc.want)
		}
	}
}
