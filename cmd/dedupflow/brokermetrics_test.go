package main

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// TestBrokerMetrics: --metrics-addr serves what an operator watches a
// subscription by (messages waiting, delivered and not acknowledged, the
// oldest one's age, the StreamingPull streams open) and the process's own
// goroutines and resident memory.
func TestBrokerMetrics(t *testing.T) {
	maddr := freeAddr(t)
	addr := serveBroker(t, "--listen", "127.0.0.1:0", "--project", "ops", "--subscription", "orders:orders-sub", "--metrics-addr", maddr)
	base := "http://" + maddr
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, "ops", pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Publisher("orders")
	defer p.Stop()
	for i := range 3 {
		if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint("order ", i))}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	const sub = `{subscription="projects/ops/subscriptions/orders-sub"}`
	m, err := testenv.Scrape(base)
	if err != nil {
		t.Fatal(err)
	}
	if m["dedupflow_broker_undelivered_messages"+sub] != 3 || m["dedupflow_broker_unacked_messages"+sub] != 0 {
		t.Errorf("after 3 publishes: undelivered %v, unacked %v; want 3, 0",
			m["dedupflow_broker_undelivered_messages"+sub], m["dedupflow_broker_unacked_messages"+sub])
	}
	if m["go_goroutines"] < 1 || m["process_resident_memory_bytes"] < 1<<20 {
		t.Errorf("go_goroutines %v, process_resident_memory_bytes %v: want the process's own metrics", m["go_goroutines"], m["process_resident_memory_bytes"])
	}

	// One message pulled and not acknowledged.
	resp, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: "projects/ops/subscriptions/orders-sub", MaxMessages: 1})
	if err != nil || len(resp.ReceivedMessages) != 1 {
		t.Fatalf("pull: %v, %d messages", err, len(resp.GetReceivedMessages()))
	}
	if m, err = testenv.Scrape(base); err != nil {
		t.Fatal(err)
	}
	if m["dedupflow_broker_undelivered_messages"+sub] != 2 || m["dedupflow_broker_unacked_messages"+sub] != 1 {
		t.Errorf("after a pull: undelivered %v, unacked %v; want 2, 1",
			m["dedupflow_broker_undelivered_messages"+sub], m["dedupflow_broker_unacked_messages"+sub])
	}
	if age := m["dedupflow_broker_oldest_unacked_message_age_seconds"+sub]; age <= 0 || age > time.Minute.Seconds() {
		t.Errorf("oldest unacked age %v s: want the age of the first publish", age)
	}
	if code := testenv.Readyz(base); code != http.StatusOK {
		t.Errorf("/readyz: %d, want 200", code)
	}

	// A StreamingPull stream counts while it is open, and no longer once
	// its subscriber has gone.
	if m["dedupflow_broker_open_streaming_pulls"+sub] != 0 {
		t.Errorf("open_streaming_pulls %v before any stream, want 0", m["dedupflow_broker_open_streaming_pulls"+sub])
	}
	sctx, cancel := context.WithCancel(ctx)
	stream, err := c.SubscriptionAdminClient.StreamingPull(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&pb.StreamingPullRequest{Subscription: "projects/ops/subscriptions/orders-sub", StreamAckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if r, err := stream.Recv(); err != nil || len(r.ReceivedMessages) == 0 {
		t.Fatalf("streaming pull: %v, %d messages", err, len(r.GetReceivedMessages()))
	}
	if m, err = testenv.Scrape(base); err != nil {
		t.Fatal(err)
	}
	if got := m["dedupflow_broker_open_streaming_pulls"+sub]; got != 1 {
		t.Errorf("open_streaming_pulls %v with one stream open, want 1", got)
	}
	cancel()
	// The broker learns of the cancel from the connection.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if m, err = testenv.Scrape(base); err != nil {
			t.Fatal(err)
		}
		if m["dedupflow_broker_open_streaming_pulls"+sub] == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open_streaming_pulls %v 10 s after the stream was cancelled, want 0", m["dedupflow_broker_open_streaming_pulls"+sub])
		}
	}
}

// TestBrokerMetricsTransforms: each message transform's filtered and failed
// counts, by resource and function, as the /broker page shows them.
func TestBrokerMetricsTransforms(t *testing.T) {
	maddr := freeAddr(t)
	addr := serveBroker(t, "--listen", "127.0.0.1:0", "--project", "ops", "--subscription", "orders:orders-sub", "--metrics-addr", maddr)
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, "ops", pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const topic, sub = "projects/ops/topics/orders", "projects/ops/subscriptions/orders-sub"
	udf := func(name, code string) []*pb.MessageTransform {
		return []*pb.MessageTransform{{Transform: &pb.MessageTransform_JavascriptUdf{
			JavascriptUdf: &pb.JavaScriptUDF{FunctionName: name, Code: code}}}}
	}
	if _, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic:      &pb.Topic{Name: topic, MessageTransforms: udf("drop", `function drop(m) { return m.data === "test" ? null : m; }`)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"message_transforms"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub, MessageTransforms: udf("strict", `function strict(m) { throw new Error("no"); }`)},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"message_transforms"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic,
		Messages: []*pb.PubsubMessage{{Data: []byte("test")}, {Data: []byte("order")}}}); err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if r, err := c.SubscriptionAdminClient.Pull(pctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10}); err == nil && len(r.ReceivedMessages) > 0 {
		t.Fatalf("pulled %v through a transform that throws", r.ReceivedMessages)
	}
	// The Pull above can end before the broker ran the subscription's
	// transform: wait for the counts.
	testenv.WaitMetrics(t, "http://"+maddr, map[string]float64{
		`dedupflow_broker_transform_filtered_messages_total{function="drop",index="0",resource="` + topic + `"}`: 1,
		`dedupflow_broker_transform_failed_messages_total{function="drop",index="0",resource="` + topic + `"}`:   0,
		`dedupflow_broker_transform_failed_messages_total{function="strict",index="0",resource="` + sub + `"}`:   1,
	})
}
