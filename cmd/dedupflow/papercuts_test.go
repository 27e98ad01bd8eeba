package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// TestPortsInUseAllAtOnce: with several of its ports taken, broker and
// up name every one in one error, not one per try.
func TestPortsInUseAllAtOnce(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	var taken []string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		taken = append(taken, ln.Addr().String())
	}
	for _, tc := range []struct {
		args  []string
		flags []string
	}{
		{[]string{"broker", "--listen", taken[0], "--console", taken[1], "--metrics-addr", "127.0.0.1:0"}, []string{"--listen", "--console"}},
		{[]string{"up", "--broker-addr", taken[0], "--console-addr", "127.0.0.1:0", "--metrics-addr", taken[1]}, []string{"--broker-addr", "--metrics-addr"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		var stdout, stderr testenv.Buffer
		err := run(ctx, tc.args, &stdout, &stderr)
		cancel()
		for i, flag := range tc.flags {
			if err == nil || !strings.Contains(err.Error(), flag+" "+taken[i]+": ") {
				t.Errorf("%s with %v taken: %v, want each taken port named with its flag", tc.args[0], taken, err)
			}
		}
	}
}

// TestLoadgenNeedsCount: loadgen without --count says the flag is
// missing, not that 0 is too few.
func TestLoadgenNeedsCount(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1") // never reached
	var stdout, stderr testenv.Buffer
	err := run(context.Background(), []string{"loadgen", "--project", "p", "--topic", "events"}, &stdout, &stderr)
	if err == nil || !strings.HasPrefix(err.Error(), "missing --count") {
		t.Errorf("loadgen without --count: %v, want missing --count", err)
	}
}

// TestLineProgressStopped: the last progress line of a run that stopped
// short says so, and does not end in "done".
func TestLineProgressStopped(t *testing.T) {
	var b testenv.Buffer
	p := newLineProgress(&b, 10, time.Hour)
	p.add(4)
	p.finish(false)
	if got := b.String(); strings.Contains(got, "done") || !strings.HasPrefix(got, "loadgen: 4/10 messages (40%)") || !strings.HasSuffix(got, ", stopped before the end\n") {
		t.Errorf("progress of a stopped run: %q", got)
	}
}

// TestPublishKeyRule: publish refuses a key the pipeline would refuse,
// with the pipeline's own words, before anything is published.
func TestPublishKeyRule(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "127.0.0.1:1") // never reached
	var stdout, stderr testenv.Buffer
	err := run(context.Background(), []string{"publish", "--project", "p", "--topic", "events", "--data", "x", "--key", "message-id:5"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), dedup.ErrKeyReserved.Error()) {
		t.Errorf("publish --key message-id:5: %v, want %q", err, dedup.ErrKeyReserved)
	}
}

// TestPublishEmptyKey: --key ” publishes without a key, as the console's
// empty Key field does; leaving --key out stamps a new one.
func TestPublishEmptyKey(t *testing.T) {
	b, _, c := serveTestBroker(t, "p")
	ctx := context.Background()
	topic := pubsubio.Name{Project: "p", Kind: "topics", ID: "events"}
	sub := pubsubio.Name{Project: "p", Kind: "subscriptions", ID: "events-sub"}
	if err := pubsubio.EnsureTopic(ctx, c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 10); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--key", ""}, nil} {
		var stdout, stderr testenv.Buffer
		if err := run(ctx, append([]string{"publish", "--project", "p", "--topic", "events", "--data", "x"}, args...), &stdout, &stderr); err != nil {
			t.Fatalf("publish %q: %v\n%s", args, err, &stderr)
		}
	}
	msgs, err := b.Peek(sub.String(), 10)
	if err != nil || len(msgs) != 2 {
		t.Fatalf("peek: %d messages, %v", len(msgs), err)
	}
	if k, ok := msgs[0].Attributes["key"]; ok {
		t.Errorf("publish --key '': key %q, want none", k)
	}
	if msgs[1].Attributes["key"] == "" {
		t.Errorf("publish without --key: no key, want a new one")
	}
}

// TestSubscribeTopicHint: subscribe given a topic's ID says it is a topic
// and how to read it.
func TestSubscribeTopicHint(t *testing.T) {
	_, c := startBroker(t, "p")
	if err := pubsubio.EnsureTopic(context.Background(), c, pubsubio.Name{Project: "p", Kind: "topics", ID: "events"}); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr testenv.Buffer
	err := run(context.Background(), []string{"subscribe", "--project", "p", "--subscription", "events"}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "events is a topic") || !strings.Contains(err.Error(), "--topic events") {
		t.Errorf("subscribe --subscription TOPIC: %v, want a hint that it is a topic", err)
	}
}

// TestPushEndpointWildcard: a pipeline pushed to on a wildcard address
// names an endpoint a local push subscription can use.
func TestPushEndpointWildcard(t *testing.T) {
	_, c := startBroker(t, "test")
	if err := pubsubio.EnsureTopic(context.Background(), c, pubsubio.Name{Project: "test", Kind: "topics", ID: "output"}); err != nil {
		t.Fatal(err)
	}
	ep, _ := startPushPipeline(t, "0.0.0.0:0")
	if !strings.HasPrefix(ep, "http://127.0.0.1:") || !strings.HasSuffix(ep, "/push") {
		t.Errorf("push endpoint %s, want http://127.0.0.1:PORT/push", ep)
	}
}
