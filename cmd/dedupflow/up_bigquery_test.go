package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	gbq "cloud.google.com/go/bigquery"
	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
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
	c, err := pubsub.NewClient(ctx, upDefaultProj, pubsubio.Insecure(u.brokerAddr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Publisher(upInputTopic)
	defer p.Stop()
	for range 2 {
		if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("order 1"), Attributes: map[string]string{"key": "o-1"}}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
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
