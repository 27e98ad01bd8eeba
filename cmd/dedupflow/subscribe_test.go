package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

func TestSubscribe(t *testing.T) {
	_, c := startBroker(t, "p")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := pubsubio.Name{Project: "p", Kind: "topics", ID: "topicFromDataflow"}
	sub := pubsubio.Name{Project: "p", Kind: "subscriptions", ID: "topicFromDataflow.subscriptionFromDataflow"}
	if err := pubsubio.EnsureTopic(ctx, c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 10); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(topic.String())
	defer pub.Stop()
	publish := func(data string, attrs map[string]string) {
		t.Helper()
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(data), Attributes: attrs}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	subscribe := func(args ...string) string {
		t.Helper()
		var stdout, stderr testenv.Buffer
		all := append([]string{"subscribe", "--project", "p", "--subscription", sub.ID}, args...)
		if err := run(ctx, all, &stdout, &stderr); err != nil {
			t.Fatalf("subscribe %v: %v\n%s", args, err, &stderr)
		}
		return stdout.String()
	}

	// The Spring app's line; a payload cannot forge another line.
	publish("Message 1", map[string]string{"key": "123"})
	if got, want := subscribe("--count", "1"), "Received message: \"Message 1\".\n"; got != want {
		t.Errorf("text: %q, want %q", got, want)
	}
	publish("two\nlines", nil)
	if got, want := subscribe("--count", "1"), "Received message: \"two\\nlines\".\n"; got != want {
		t.Errorf("text: %q, want %q", got, want)
	}

	publish("\xff\xfe", map[string]string{"key": "bin"})
	var m map[string]any
	if err := json.Unmarshal([]byte(subscribe("--json", "--count", "1")), &m); err != nil {
		t.Fatal(err)
	}
	if m["data_base64"] != "//4=" || m["data"] != nil || m["message_id"] == "" || m["publish_time"] == "" ||
		m["attributes"].(map[string]any)["key"] != "bin" {
		t.Errorf("json of a binary payload: %v", m)
	}
}

func TestSubscribeFlags(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1") // never reached
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "missing --subscription"},
		{[]string{"--subscription", "s"}, "needs a project"},
		{[]string{"--subscription", "projects/p/topics/t"}, "malformed"},
		{[]string{"--subscription", "sub", "--project", "p", "--count", "-1"}, "--count"},
	} {
		var stdout, stderr testenv.Buffer
		err := run(context.Background(), append([]string{"subscribe"}, tc.args...), &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("subscribe %v: %v, want an error mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestSubscribeCountNacksTheRest: subscribe --count 1 hands back at once
// the messages it fetched but did not print, so the next reader gets them
// now, not after the 60 s ack deadline.
func TestSubscribeCountNacksTheRest(t *testing.T) {
	_, _, c := serveTestBroker(t, "p")
	ctx := context.Background()
	topic := pubsubio.Name{Project: "p", Kind: "topics", ID: "tail"}
	sub := pubsubio.Name{Project: "p", Kind: "subscriptions", ID: "tail-sub"}
	if err := pubsubio.EnsureTopic(ctx, c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 60); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(topic.String())
	for i := range 5 {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte{'0' + byte(i)}}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pub.Stop()
	var stdout, stderr testenv.Buffer
	if err := run(ctx, []string{"subscribe", "--project", "p", "--subscription", sub.ID, "--count", "1"}, &stdout, &stderr); err != nil {
		t.Fatalf("subscribe: %v\n%s", err, &stderr)
	}
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := map[string]bool{}
	_ = c.Subscriber(sub.String()).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		defer mu.Unlock()
		got[string(m.Data)] = true
		if len(got) == 4 {
			cancel()
		}
	})
	if len(got) != 4 {
		t.Errorf("within 15 s of subscribe --count 1, %d of the 4 messages it did not print came back", len(got))
	}
}
