package e2e

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
	t.Parallel()
	e := newCrashEnv(t)
	ctx := context.Background()
	e.createTopicSub("output", "out-sub")
	e.createTopic("events")
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
	pubs := publishKeys(t, e, "events", "a", "b", "a", "c", "a")
	checkKeysOut(t, p, out, pubs, "a", "b", "c")

	_, err := e.client.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
	if status.Code(err) != codes.NotFound {
		t.Errorf("after a clean exit, the pipeline's subscription %q: %v, want NotFound", sub, err)
	}
}

// publishKeys publishes one message per key (repeats are republished
// copies), each with the key in eid, and records the message IDs.
func publishKeys(t *testing.T, e *crashEnv, topic string, keys ...string) *published {
	t.Helper()
	pub := e.client.Publisher(e.topic(topic))
	defer pub.Stop()
	pubs := &published{ids: map[string][]string{}}
	for _, k := range keys {
		id, err := pub.Publish(context.Background(), &pubsub.Message{Data: []byte("payload-" + k), Attributes: map[string]string{"eid": k}}).Get(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		pubs.ids[k] = append(pubs.ids[k], id)
	}
	return pubs
}

// checkKeysOut waits until the want keys came out and the output went
// quiet, stops the pipeline, and checks every key came out once.
func checkKeysOut(t *testing.T, p *pipelineProc, out *outputReader, pubs *published, want ...string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if n, quiet := out.state(); n == len(want) && quiet > 500*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			n, _ := out.state()
			t.Fatalf("%d of %d keys came out within 30s\n%s", n, len(want), p.tail())
		}
	}
	p.stop()
	out.close(t)
	out.check(t, want, pubs)
}
