package pipeline_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// The pipeline as a push endpoint of Google's emulator and of our broker:
// the seed's Messages 2, 3 and 4 with key 456 are pushed, only one reaches
// the output topic, and ServePush returns cleanly when its context ends.
func TestServePush(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, servePushSeed)
}

func servePushSeed(t *testing.T, host string) {
	r := newRig(t, pubsubio.Insecure(host), rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.p.ServePush(ctx, ln, pipeline.PushOptions{Path: "/push"}) }()
	push := pubsubio.Name{Project: r.inSub.Project, Kind: "subscriptions", ID: "push-" + r.inSub.ID}
	if _, err := r.c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pubsubpb.Subscription{
		Name: push.String(), Topic: r.in.String(), AckDeadlineSeconds: 10,
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: "http://" + ln.Addr().String() + "/push"},
	}); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"Message 2", "Message 3", "Message 4"} {
		r.publish(m, map[string]string{"key": "456"})
	}
	n := r.waitCounts("all three", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == 3 })
	if n.Emitted != 1 || n.DuplicateRepublish != 2 {
		t.Fatalf("counts %+v: want 1 emitted, 2 republishes", n)
	}
	out := r.drain(r.outSub, 1, 300*time.Millisecond)
	// Pushes come concurrently, so any one of the three may be first.
	if len(out) != 1 || out[0].attrs["key"] != "456" {
		t.Fatalf("output %+v: want one of the three alone, keyed 456", out)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("ServePush returned %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("ServePush still serving 20 s after its context ended")
	}
}
