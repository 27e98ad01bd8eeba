package main

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// With --input-topic the pipeline reads through a subscription of its own,
// as Dataflow does: made at start (so it sees what is published from then
// on), deduplicated like any input, and removed on a clean exit so that
// nothing keeps accumulating a backlog for a pipeline that is gone.
func TestInputTopicOwnSubscription(t *testing.T) {
	e := newCrashEnv(t)
	ctx := context.Background()
	e.createTopicSub("output", "out-sub")
	if _, err := e.client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: e.topic("events")}); err != nil {
		t.Fatal(err)
	}
	p := &pipelineProc{e: e, args: []string{"pipeline",
		"--input-topic", e.topic("events"), "--id-attribute", "eid",
		"--sink", "pubsub", "--output-topic", e.topic("output"),
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json"}}
	p.start()
	sub, _ := p.waitLog(t, "pipeline running", 30*time.Second)["input"].(string)
	if _, err := e.client.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub}); err != nil {
		t.Fatalf("the pipeline's subscription %q: %v", sub, err)
	}

	out := readOutput(e, "out-sub")
	pub := e.client.Publisher(e.topic("events"))
	pubs := &published{ids: map[string][]string{}}
	for _, k := range []string{"a", "b", "a", "c", "a"} {
		id, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("payload-" + k), Attributes: map[string]string{"eid": k}}).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pubs.ids[k] = append(pubs.ids[k], id)
	}
	pub.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; {
		if n, quiet := out.state(); n == 3 && quiet > 500*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			n, _ := out.state()
			t.Fatalf("%d of 3 keys came out within 30s\n%s", n, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	p.stop()
	out.close(t)
	out.check(t, []string{"a", "b", "c"}, pubs)

	_, err := e.client.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
	if status.Code(err) != codes.NotFound {
		t.Errorf("after a clean exit, the pipeline's subscription %q: %v, want NotFound", sub, err)
	}
}
