package broker

//lint:file-ignore SA1019 the test pulls with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty dead-letter topic at once

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	gbq "cloud.google.com/go/bigquery"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// bqServer is a client of the test's BigQuery emulator and a fresh dataset.
func bqServer(t testing.TB) (bigquery.Endpoints, *bigquery.Client, string) {
	t.Helper()
	project := testenv.BigQuery(t)
	ep := bigquery.EndpointsFromEnv()
	c, err := bigquery.Open(t.Context(), project, ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ds := fmt.Sprintf("bx%d", time.Now().UnixNano())
	if err := c.CreateDataset(t.Context(), ds); err != nil {
		t.Fatal(err)
	}
	return ep, c, ds
}

// rowCount waits until the query counts want rows, and fails after a
// while. The emulator refuses a query now and then while it takes appends
// ("database is locked"): that is asked again.
func rowCount(t *testing.T, c *bigquery.Client, q string, want int64) {
	t.Helper()
	var (
		got  int64
		qerr error
	)
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		rows, err := c.Query(t.Context(), q)
		if qerr = err; err != nil {
			continue
		}
		if got = rows[0][0].(int64); got == want {
			return
		}
	}
	t.Fatalf("%s = %d (last error: %v), want %d", q, got, qerr, want)
}

func waitBQState(t *testing.T, c *pubsub.Client, sub string, want pb.BigQueryConfig_State) {
	t.Helper()
	var got pb.BigQueryConfig_State
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		s, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: sub})
		if err != nil {
			t.Fatal(err)
		}
		if got = s.BigqueryConfig.GetState(); got == want {
			return
		}
	}
	t.Fatalf("subscription %s: bigquery state %v, want %v", sub, got, want)
}

var metadataColumns = gbq.Schema{
	{Name: "subscription_name", Type: gbq.StringFieldType}, {Name: "message_id", Type: gbq.StringFieldType},
	{Name: "publish_time", Type: gbq.TimestampFieldType}, {Name: "attributes", Type: gbq.StringFieldType},
}

func TestBigQueryExportMetadata(t *testing.T) {
	ep, bq, ds := bqServer(t)
	ref := bigquery.TableRef{Dataset: ds, Table: "raw"}
	if err := bq.CreateTable(t.Context(), ref, append(gbq.Schema{{Name: "data", Type: gbq.BytesFieldType}}, metadataColumns...)); err != nil {
		t.Fatal(err)
	}
	tg := startOurs(t, Options{Exports: ExportOptions{BigQuery: ep}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{
		Table: bq.Project + "." + ds + ".raw", WriteMetadata: true}})
	ids := publish(t, c, topic, &pubsub.Message{Data: []byte{0xff, 1}, Attributes: map[string]string{"k": "v"}}, &pubsub.Message{Data: []byte("two")})
	table := "`" + bq.Project + "." + ds + ".raw`"
	rowCount(t, bq, fmt.Sprintf("SELECT COUNT(*) FROM %s WHERE message_id = '%s' AND subscription_name = '%s' AND attributes = '{\"k\":\"v\"}' AND data = b'\\xff\\x01'", table, ids[0], sub.Name), 1)
	rowCount(t, bq, fmt.Sprintf("SELECT COUNT(*) FROM %s", table), 2)
	waitBQState(t, c, sub.Name, pb.BigQueryConfig_ACTIVE)
	backlogEmpty(t, tg.ours, sub.Name)
}

func TestBigQueryExportTableSchema(t *testing.T) {
	ep, bq, ds := bqServer(t)
	ref := bigquery.TableRef{Dataset: ds, Table: "events"}
	if err := bq.CreateTable(t.Context(), ref, gbq.Schema{{Name: "id", Type: gbq.StringFieldType}, {Name: "n", Type: gbq.IntegerFieldType}}); err != nil {
		t.Fatal(err)
	}
	tg := startOurs(t, Options{Exports: ExportOptions{BigQuery: ep}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	table := bq.Project + "." + ds + ".events"
	createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{Table: table, UseTableSchema: true, DropUnknownFields: true}})
	publish(t, c, topic, &pubsub.Message{Data: []byte(`{"id":"a","n":7,"extra":true}`)})
	rowCount(t, bq, "SELECT COUNT(*) FROM `"+table+"` WHERE id = 'a' AND n = 7", 1)
}

// A table that does not exist yet shows as NOT_FOUND and keeps the
// messages; once it is created they are written.
func TestBigQueryExportMissingTable(t *testing.T) {
	ep, bq, ds := bqServer(t)
	tg := startOurs(t, Options{Exports: ExportOptions{BigQuery: ep}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	table := bq.Project + "." + ds + ".later"
	sub := createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{Table: table}})
	waitBQState(t, c, sub.Name, pb.BigQueryConfig_NOT_FOUND)
	publish(t, c, topic, &pubsub.Message{Data: []byte("kept")})
	if err := bq.CreateTable(t.Context(), bigquery.TableRef{Dataset: ds, Table: "later"}, gbq.Schema{{Name: "data", Type: gbq.StringFieldType}}); err != nil {
		t.Fatal(err)
	}
	waitBQState(t, c, sub.Name, pb.BigQueryConfig_ACTIVE)
	rowCount(t, bq, "SELECT COUNT(*) FROM `"+table+"` WHERE data = 'kept'", 1)
	backlogEmpty(t, tg.ours, sub.Name)
}

// A table without the columns the config writes is SCHEMA_MISMATCH; a
// message that does not fit the table is tried until its dead-letter
// policy's attempts are used up, then dead-lettered with the reason.
func TestBigQueryExportSchemaMismatch(t *testing.T) {
	ep, bq, ds := bqServer(t)
	for _, tb := range []string{"nometa", "strict"} {
		if err := bq.CreateTable(t.Context(), bigquery.TableRef{Dataset: ds, Table: tb}, gbq.Schema{{Name: "id", Type: gbq.StringFieldType}}); err != nil {
			t.Fatal(err)
		}
	}
	tg := startOurs(t, Options{Exports: ExportOptions{BigQuery: ep}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{
		Table: bq.Project + "." + ds + ".nometa", UseTableSchema: true, WriteMetadata: true}})
	waitBQState(t, c, sub.Name, pb.BigQueryConfig_SCHEMA_MISMATCH)

	dlTopic := createTopic(t, c)
	dlSub := createSub(t, c, &pb.Subscription{Topic: dlTopic})
	strict := createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{
		Table: bq.Project + "." + ds + ".strict", UseTableSchema: true},
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dlTopic, MaxDeliveryAttempts: 5}})
	waitBQState(t, c, strict.Name, pb.BigQueryConfig_ACTIVE)
	ids := publish(t, c, topic, &pubsub.Message{Data: []byte(`{"id":"a","unknown":1}`)})
	var got *pb.ReceivedMessage
	// Five attempts against the emulator, each after the clock's move: a
	// loaded machine takes far longer than a quiet one, so the bound is wide.
	for end := time.Now().Add(3 * time.Minute); got == nil && time.Now().Before(end); {
		tg.clock.Advance(11 * time.Second)                                                                                                                 // past the ack deadline: another attempt
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: dlSub.Name, MaxMessages: 1, ReturnImmediately: true}) //nolint:staticcheck
		if err != nil {
			t.Fatal(err)
		}
		if len(r.ReceivedMessages) > 0 {
			got = r.ReceivedMessages[0]
		}
		time.Sleep(150 * time.Millisecond) // the broker's timer and the exporter act on the clock's move
	}
	if got == nil {
		t.Fatalf("message %s never reached the dead-letter topic", ids[0])
	}
	a := got.Message.Attributes
	if a["CloudPubSubDeadLetterSourceDeliveryCount"] != "5" || !strings.Contains(a["CloudPubSubDeadLetterSourceDeliveryErrorMessage"], "unknown") {
		t.Errorf("dead-lettered with %v: want 5 attempts and the error naming the unknown field", a)
	}
	backlogEmpty(t, tg.ours, strict.Name)
}

func TestBigQueryConfigChecks(t *testing.T) {
	c := newClient(t, startOurs(t, Options{}).addr)
	topic := createTopic(t, c)
	for _, tc := range []struct {
		name string
		cfg  *pb.BigQueryConfig
		msg  string
	}{
		{"no table", &pb.BigQueryConfig{}, "want {projectId}.{datasetId}.{tableId}"},
		{"two parts", &pb.BigQueryConfig{Table: "ds.t"}, "want {projectId}.{datasetId}.{tableId}"},
		{"both schemas", &pb.BigQueryConfig{Table: "p.ds.t", UseTableSchema: true, UseTopicSchema: true}, "cannot both be set"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{
				Name: subName(unique("s")), Topic: topic, BigqueryConfig: tc.cfg})
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
}
