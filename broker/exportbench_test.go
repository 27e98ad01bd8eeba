package broker

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	gbq "cloud.google.com/go/bigquery"
	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/bigquery"
)

// benchExport publishes b.N messages of 1 KB to a topic whose export
// subscription sub writes them, then a last message of 1 MB that closes a
// Cloud Storage batch, and waits until the subscription holds nothing: every
// message written and acknowledged.
func benchExport(b *testing.B, tg target, topic string, sub string) {
	c := newClient(b, tg.addr)
	p := c.Publisher(topic)
	defer p.Stop()
	data := bytes.Repeat([]byte("x"), 1000)
	b.ResetTimer()
	var rs []*pubsub.PublishResult
	for range b.N {
		rs = append(rs, p.Publish(context.Background(), &pubsub.Message{Data: data}))
	}
	rs = append(rs, p.Publish(context.Background(), &pubsub.Message{Data: bytes.Repeat([]byte("z"), 1_000_000)}))
	for _, r := range rs {
		if _, err := r.Get(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
	for {
		tg.ours.mu.Lock()
		held := tg.ours.subs[sub].held
		tg.ours.mu.Unlock()
		if held == 0 {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
}

// BenchmarkStorageExport: messages through a Cloud Storage subscription
// (text, objects of 1 MB) into fake-gcs-server, published to written.
func BenchmarkStorageExport(b *testing.B) {
	host, _, bucket := storageServer(b)
	tg := startOurs(b, Options{Now: time.Now, Exports: ExportOptions{StorageHost: host}})
	c := newClient(b, tg.addr)
	topic := createTopic(b, c)
	sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: bucket, MaxBytes: 1_000_000}})
	benchExport(b, tg, topic, sub.Name)
}

// BenchmarkBigQueryExport: messages through a BigQuery subscription
// (data and metadata columns) into goccy/bigquery-emulator.
func BenchmarkBigQueryExport(b *testing.B) {
	ep, bq, ds := bqServer(b)
	if err := bq.CreateTable(context.Background(), bigquery.TableRef{Dataset: ds, Table: "raw"},
		append(gbq.Schema{{Name: "data", Type: gbq.BytesFieldType}}, metadataColumns...)); err != nil {
		b.Fatal(err)
	}
	tg := startOurs(b, Options{Now: time.Now, Exports: ExportOptions{BigQuery: ep}})
	c := newClient(b, tg.addr)
	topic := createTopic(b, c)
	sub := createSub(b, c, &pb.Subscription{Topic: topic, BigqueryConfig: &pb.BigQueryConfig{
		Table: fmt.Sprintf("%s.%s.raw", bq.Project, ds), WriteMetadata: true}})
	benchExport(b, tg, topic, sub.Name)
}
