package broker

import (
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	gbq "cloud.google.com/go/bigquery"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"

	"github.com/dedupflow/dedupflow/internal/bigquery"
)

// TestStorageExportKill SIGKILLs a broker process while it exports to
// Cloud Storage, with a log small enough to be compacted meanwhile, and
// restarts it on the same data dir: the subscription's config is as it
// was, and every message whose publish was answered ends up in an object
// (a message written but not yet acknowledged when the broker died may be
// written twice, as with the service).
func TestStorageExportKill(t *testing.T) {
	host, client, bucket := storageServer(t)
	t.Setenv("STORAGE_EMULATOR_HOST", host) // brokerd reads it
	addr, dir, restart := compactingBrokerd(t)
	c := newClient(t, addr)
	topic := createTopic(t, c)
	want := &pb.CloudStorageConfig{Bucket: bucket, FilenamePrefix: "kill/", FilenameSuffix: ".txt", MaxBytes: 10_000}
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, CloudStorageConfig: want})

	published := map[string]bool{}
	publishSome := func(c *pubsub.Client, from, to int) {
		for _, id := range publishNumbered(c, topic, from, to, strings.Repeat(".", 90)) {
			published[id] = true
		}
	}
	publishSome(c, 0, 1500)
	c = newClient(t, restart())
	got, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: sub.Name})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got.CloudStorageConfig, sub.CloudStorageConfig) {
		t.Errorf("after kill -9: cloud_storage_config %v, want %v", got.CloudStorageConfig, sub.CloudStorageConfig)
	}
	publishSome(c, 1500, 3000)
	// A last message of max_bytes closes the batch it lands in.
	publish(t, c, topic, &pubsub.Message{Data: bytes.Repeat([]byte("z"), 10_000)})
	// Compaction runs beside the writes: wait for one to have ended.
	for end := time.Now().Add(30 * time.Second); !startsWithCheckpoint(t, filepath.Join(dir, logName)); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Error("the log was never compacted: the test did not check that exports survive compaction")
			break
		}
	}

	seen := map[string]int{}
	for end := time.Now().Add(60 * time.Second); ; {
		clear(seen)
		_, contents := objects(t, client, bucket, "kill/", 1)
		for _, o := range contents {
			for line := range strings.SplitSeq(strings.TrimSuffix(string(o), "\n"), "\n") {
				if len(line) >= 6 && line[0] == 'm' {
					seen[line[:6]]++
				}
			}
		}
		missing := 0
		for id := range published {
			if seen[id] == 0 {
				missing++
			}
		}
		if missing == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("%d of %d published messages never reached the bucket", missing, len(published))
		}
		time.Sleep(200 * time.Millisecond)
	}
	twice := 0
	for _, n := range seen {
		if n > 1 {
			twice++
		}
	}
	t.Logf("%d messages published, all written; %d written twice across the kill", len(published), twice)
}

// TestBigQueryExportKill is TestStorageExportKill for a BigQuery
// subscription: every message whose publish was answered becomes a row.
func TestBigQueryExportKill(t *testing.T) {
	_, bq, ds := bqServer(t)
	if err := bq.CreateTable(t.Context(), bigquery.TableRef{Dataset: ds, Table: "raw"}, gbq.Schema{{Name: "data", Type: gbq.StringFieldType}}); err != nil {
		t.Fatal(err)
	}
	addr, _, restart := compactingBrokerd(t) // brokerd reads BIGQUERY_EMULATOR_HOST and BIGQUERY_STORAGE_EMULATOR_HOST
	c := newClient(t, addr)
	topic := createTopic(t, c)
	table := bq.Project + "." + ds + ".raw"
	createSub(t, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{Table: table}})
	answered := 0
	publishSome := func(c *pubsub.Client, from, to int) { answered += len(publishNumbered(c, topic, from, to, "")) }
	publishSome(c, 0, 1500)
	c = newClient(t, restart())
	publishSome(c, 1500, 3000)
	rowCount(t, bq, "SELECT COUNT(DISTINCT data) FROM `"+table+"`", int64(answered))
	rows, err := bq.Query(t.Context(), "SELECT COUNT(*) FROM `"+table+"`")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages published, all written; %d rows (written twice across the kill: %d)", answered, rows[0][0], rows[0][0].(int64)-int64(answered))
}

// compactingBrokerd starts a broker process on a fresh data dir, with a
// log small enough to be compacted while a test publishes, and stops it
// when the test ends. restart SIGKILLs it and starts it again on the same
// dir, returning its new address.
func compactingBrokerd(t *testing.T) (addr, dir string, restart func() string) {
	bin, dir := buildBrokerd(t), t.TempDir()
	flags := []string{"--compact-size", fmt.Sprint(64 << 10)}
	cmd, addr := startBrokerd(t, bin, dir, flags...)
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	return addr, dir, func() string {
		kill9(t, cmd)
		var a string
		cmd, a = startBrokerd(t, bin, dir, flags...)
		return a
	}
}

// publishNumbered publishes messages from..to-1 to topic, each with data
// "m" and its number in five digits, then pad, and returns the "m%05d" of
// those whose publish was answered.
func publishNumbered(c *pubsub.Client, topic string, from, to int, pad string) []string {
	p := c.Publisher(topic)
	defer p.Stop()
	var rs []*pubsub.PublishResult
	for i := from; i < to; i++ {
		rs = append(rs, p.Publish(context.Background(), &pubsub.Message{Data: fmt.Appendf(nil, "m%05d%s", i, pad)}))
	}
	var answered []string
	for i, r := range rs {
		if _, err := r.Get(context.Background()); err == nil {
			answered = append(answered, fmt.Sprintf("m%05d", from+i))
		}
	}
	return answered
}
