package e2e

import (
	"context"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// With --input-push the pipeline is the endpoint of a push subscription:
// it names the endpoint to configure, and what the broker pushes is
// deduplicated like pulled input (the seed's key 456 three times: one
// output), with the same metrics and readiness.
func TestInputPush(t *testing.T) {
	t.Parallel()
	e := newCrashEnv(t)
	e.createTopicSub("output", "out-sub")
	e.createTopic("events")
	p := &pipelineProc{e: e, args: []string{"pipeline",
		"--input-push", "127.0.0.1:0", "--push-path", "/push", "--id-attribute", "eid",
		"--project", e.project, "--output-topic", "output",
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json"}}
	p.start()
	endpoint, _ := p.waitLog(t, "pipeline running", 30*time.Second)["push_endpoint"].(string)
	if endpoint == "" {
		t.Fatalf("no endpoint named\n%s", p.tail())
	}
	ctx := context.Background()
	if _, err := e.client.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: e.sub("push"), Topic: e.topic("events"), AckDeadlineSeconds: 10,
		PushConfig: &pb.PushConfig{PushEndpoint: endpoint},
	}); err != nil {
		t.Fatal(err)
	}
	out := readOutput(e, "out-sub")
	pubs := publishKeys(t, e, "events", "123", "456", "456", "456")
	checkKeysOut(t, p, out, pubs, "123", "456")
}
