package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestOtherProjects: a full resource name stands for itself, whatever
// --project says, for the input, the output, the dead-letter topic,
// publish and subscribe; --project completes short IDs and holds the
// subscription a pipeline makes for --input-topic, as Dataflow's does.
func TestOtherProjects(t *testing.T) {
	_, c := startBroker(t, "home")
	ctx := context.Background()
	for topic, sub := range map[string]string{
		"projects/central/topics/events": "projects/central/subscriptions/events-dedup",
		"projects/sinks/topics/out":      "projects/sinks/subscriptions/out-sub",
		"projects/ops/topics/dead":       "projects/ops/subscriptions/dead-sub",
	} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 10}); err != nil {
			t.Fatal(err)
		}
	}
	// running starts the pipeline and returns its start line.
	running := func(args ...string) (line string, stop func()) {
		t.Helper()
		var stdout, stderr testenv.Buffer
		pctx, cancel := context.WithCancel(ctx)
		done, exited := make(chan error, 1), make(chan struct{})
		go func() {
			done <- run(pctx, append([]string{"pipeline", "--project", "home", "--metrics-addr", ""}, args...), &stdout, &stderr)
			close(exited)
		}()
		line = waitFor(t, "start line", &stderr, &stdout, regexp.MustCompile(`(?m)^(.*msg="pipeline running".*)$`), exited)
		return line, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("pipeline %q: %v\n%s", args, err, &stderr)
			}
		}
	}

	line, stop := running("--input-subscription", "projects/central/subscriptions/events-dedup",
		"--output-topic", "projects/sinks/topics/out", "--dead-letter-topic", "projects/ops/topics/dead",
		"--id-attribute", "key", "--missing-id", "reject")
	defer stop()
	if !strings.Contains(line, "input=projects/central/subscriptions/events-dedup") || !strings.Contains(line, "output=projects/sinks/topics/out") {
		t.Errorf("start line %q: want the input and output in their own projects", line)
	}
	for _, args := range [][]string{
		{"--key", "k1", "--data", "keyed"},
		{"--id-attribute", "other", "--key", "k2", "--data", "keyless"}, // no "key": to the dead-letter topic
	} {
		if _, errOut, err := pubRun(t, append([]string{"publish", "--project", "home", "--topic", "projects/central/topics/events"}, args...)...); err != nil {
			t.Fatalf("publish %q: %v\n%s", args, err, errOut)
		}
	}
	for sub, want := range map[string]string{"projects/sinks/subscriptions/out-sub": "keyed", "projects/ops/subscriptions/dead-sub": "keyless"} {
		out, errOut, err := pubRun(t, "subscribe", "--project", "home", "--subscription", sub, "--count", "1", "--json")
		if err != nil {
			t.Fatalf("subscribe %s: %v\n%s", sub, err, errOut)
		}
		var m received
		if err := json.Unmarshal([]byte(out), &m); err != nil || m.Data == nil || *m.Data != want {
			t.Errorf("subscribe %s: %q (%v), want the message %q", sub, out, err, want)
		}
	}

	// Our own subscription of another project's topic is in --project.
	line, stopTopic := running("--input-topic", "projects/central/topics/events", "--sink", "stdout")
	stopTopic()
	if !regexp.MustCompile(`input=projects/home/subscriptions/events\.dedupflow-[0-9a-f]+ `).MatchString(line) {
		t.Errorf("start line %q: want our subscription in project home", line)
	}
}
