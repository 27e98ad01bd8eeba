package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/storage"
	"google.golang.org/api/option"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// TestBrokerMetricsExport: a Cloud Storage subscription shows what it wrote
// (sent_message_count, as Cloud Monitoring names it) and its state; one
// whose bucket is missing shows NOT_FOUND. The broker reads the storage
// server from STORAGE_EMULATOR_HOST, as the Go storage client does.
func TestBrokerMetricsExport(t *testing.T) {
	host := testenv.StorageEmulatorHost(t)
	t.Setenv("STORAGE_EMULATOR_HOST", host)
	ctx := context.Background()
	sc, err := storage.NewClient(ctx, option.WithEndpoint(strings.TrimSuffix(host, "/")+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer sc.Close()
	bucket := "metrics-" + strings.ToLower(time.Now().Format("150405.000000000"))
	bucket = strings.ReplaceAll(bucket, ".", "-")
	if err := sc.Bucket(bucket).Create(ctx, "ops", nil); err != nil {
		t.Fatal(err)
	}
	maddr := freeAddr(t)
	addr := serveBroker(t, "--listen", "127.0.0.1:0", "--project", "ops", "--topic", "orders", "--metrics-addr", maddr)
	c, err := pubsub.NewClient(ctx, "ops", pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for id, b := range map[string]string{"to-gcs": bucket, "to-nowhere": bucket + "-missing"} {
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: "projects/ops/subscriptions/" + id,
			Topic: "projects/ops/topics/orders", AckDeadlineSeconds: 60,
			CloudStorageConfig: &pb.CloudStorageConfig{Bucket: b, MaxBytes: 1000}}); err != nil {
			t.Fatal(err)
		}
	}
	p := c.Publisher("orders")
	defer p.Stop()
	if _, err := p.Publish(ctx, &pubsub.Message{Data: bytes.Repeat([]byte("x"), 1000)}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	const (
		gcs     = `{delivery_type="cloud_storage",subscription="projects/ops/subscriptions/to-gcs"}`
		active  = `{delivery_type="cloud_storage",state="ACTIVE",subscription="projects/ops/subscriptions/to-gcs"}`
		missing = `{delivery_type="cloud_storage",state="NOT_FOUND",subscription="projects/ops/subscriptions/to-nowhere"}`
	)
	var m map[string]float64
	for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if m, err = testenv.Scrape("http://" + maddr); err != nil {
			t.Fatal(err)
		}
		if m["dedupflow_broker_export_sent_messages_total"+gcs] == 1 && m["dedupflow_broker_export_state"+missing] == 1 {
			break
		}
	}
	if m["dedupflow_broker_export_sent_messages_total"+gcs] != 1 || m["dedupflow_broker_export_sent_bytes_total"+gcs] != 1000 ||
		m["dedupflow_broker_export_writes_total"+gcs] != 1 || m["dedupflow_broker_export_state"+active] != 1 ||
		m["dedupflow_broker_export_state"+missing] != 1 {
		t.Errorf("export metrics: sent %v, bytes %v, writes %v, active %v, missing bucket NOT_FOUND %v; want 1, 1000, 1, 1, 1",
			m["dedupflow_broker_export_sent_messages_total"+gcs], m["dedupflow_broker_export_sent_bytes_total"+gcs],
			m["dedupflow_broker_export_writes_total"+gcs], m["dedupflow_broker_export_state"+active], m["dedupflow_broker_export_state"+missing])
	}
}
