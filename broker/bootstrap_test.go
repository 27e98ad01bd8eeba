package broker

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// bootstrapYAML is a bootstrap file as a user writes it: the REST API's
// resources, in YAML, with short IDs in the given project.
const bootstrapYAML = `
topics:
  - name: orders
    labels: {team: shop}
  - name: orders-dead
subscriptions:
  - name: orders-eu
    topic: orders
    filter: 'attributes.region = "eu" AND NOT attributes:test'
    ackDeadlineSeconds: 30
    enableMessageOrdering: true
    deadLetterPolicy:
      deadLetterTopic: orders-dead
      maxDeliveryAttempts: 6
    retryPolicy: {minimumBackoff: 5s, maximumBackoff: 60s}
    pushConfig: {}
  - name: orders-push
    topic: orders
    pushConfig:
      pushEndpoint: http://127.0.0.1:1/push
      noWrapper: {writeMetadata: true}
  - name: orders-dead-all
    topic: projects/other/topics/audit
`

// gcloudJSON is what `gcloud pubsub subscriptions list --format=json`
// prints, output-only fields included.
const gcloudJSON = `[
  {
    "ackDeadlineSeconds": 10,
    "expirationPolicy": {"ttl": "2678400s"},
    "messageRetentionDuration": "604800s",
    "name": "projects/p1/subscriptions/s1",
    "pushConfig": {},
    "state": "ACTIVE",
    "topic": "projects/p1/topics/t1"
  },
  {"name": "projects/p1/topics/t1"}
]`

func TestParseResources(t *testing.T) {
	r, err := ParseResources([]byte(bootstrapYAML), "shop")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Topics) != 2 || r.Topics[0].Name != "projects/shop/topics/orders" || r.Topics[0].Labels["team"] != "shop" {
		t.Errorf("topics: %v", r.Topics)
	}
	s := r.Subscriptions[0]
	if s.Name != "projects/shop/subscriptions/orders-eu" || s.Topic != "projects/shop/topics/orders" ||
		s.DeadLetterPolicy.DeadLetterTopic != "projects/shop/topics/orders-dead" || s.DeadLetterPolicy.MaxDeliveryAttempts != 6 ||
		!s.EnableMessageOrdering || s.AckDeadlineSeconds != 30 || s.RetryPolicy.MaximumBackoff.AsDuration() != time.Minute ||
		!strings.Contains(s.Filter, `"eu"`) {
		t.Errorf("subscription: %v", s)
	}
	if p := r.Subscriptions[1].PushConfig; p.PushEndpoint != "http://127.0.0.1:1/push" || !p.GetNoWrapper().WriteMetadata {
		t.Errorf("push config: %v", p)
	}
	if r.Subscriptions[2].Topic != "projects/other/topics/audit" {
		t.Errorf("a full name is kept: %v", r.Subscriptions[2].Topic)
	}
	g, err := ParseResources([]byte(gcloudJSON), "")
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Topics) != 1 || len(g.Subscriptions) != 1 || g.Subscriptions[0].ExpirationPolicy.Ttl.AsDuration() != 31*24*time.Hour {
		t.Errorf("gcloud list: %v", g)
	}
	one, err := ParseResources([]byte(`{"name": "projects/p/topics/t"}`), "")
	if err != nil || len(one.Topics) != 1 {
		t.Errorf("one resource: %v %v", one, err)
	}
	for _, c := range []struct{ file, want string }{
		{"topics:\n  - name: t\n    colour: red\n", `unknown field "colour"`},
		{"topics:\n  - name: t\n", `"t" is a short ID and no project is given`},
		{"topics: [{name: t}]\nsubscription: []\n", `unknown key "subscription"`},
		{"subscriptions:\n  - name: s\n    topic: t\n    ackDeadlineSeconds: ten\n", `subscription 1`},
		{"topics: [", "not YAML or JSON"},
		{"42", "want an object"},
	} {
		_, err := ParseResources([]byte(c.file), "")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: got %v, want an error containing %q", c.file, err, c.want)
		}
	}
}

// TestEnsureTwice reads the same bootstrap file into a broker twice, the
// second time after a restart with the data dir: nothing changes and
// nothing fails. A file that asks for another configuration is an error
// naming the field.
func TestEnsureTwice(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	file := bootstrapYAML + `    topic: audit
` // the last subscription's topic, short this time
	file = strings.Replace(file, "    topic: projects/other/topics/audit\n", "", 1)
	file = strings.Replace(file, "  - name: orders-dead\n", "  - name: orders-dead\n  - name: audit\n", 1)
	r, err := ParseResources([]byte(file), project)
	if err != nil {
		t.Fatal(err)
	}
	for round := range 2 {
		b := startOurs(t, Options{DataDir: dir}).ours
		if err := b.Ensure(ctx, r); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		s, err := b.sub.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: subName("orders-eu")})
		if err != nil || s.DeadLetterPolicy.GetMaxDeliveryAttempts() != 6 || s.Filter == "" || !s.EnableMessageOrdering {
			t.Fatalf("round %d: %v %v", round, s, err)
		}
		if round == 0 {
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
		}
	}
	b := startOurs(t, Options{DataDir: t.TempDir()}).ours
	if err := b.Ensure(ctx, r); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ from, to, field string }{
		{"ackDeadlineSeconds: 30", "ackDeadlineSeconds: 20", "ackDeadlineSeconds is 30, the bootstrap asks for 20"},
		{"maxDeliveryAttempts: 6", "maxDeliveryAttempts: 9", "deadLetterPolicy.maxDeliveryAttempts is 6, the bootstrap asks for 9"},
		{"labels: {team: shop}", "labels: {team: ops}", `topic projects/dedupflow-test/topics/orders exists with a different configuration: labels is {"team":"shop"}`},
		{`    filter: 'attributes.region = "eu" AND NOT attributes:test'` + "\n", "", "filter is"},
		{"maximumBackoff: 60s", "maximumBackoff: 61s", `retryPolicy.maximumBackoff is "60s", the bootstrap asks for "61s"`},
		{"127.0.0.1:1/push", "127.0.0.1:2/push", `pushConfig.pushEndpoint is "http://127.0.0.1:1/push", the bootstrap asks for "http://127.0.0.1:2/push"`},
		{"writeMetadata: true", "writeMetadata: false", `pushConfig.noWrapper.writeMetadata is true, the bootstrap asks for`},
	} {
		changed, err := ParseResources([]byte(strings.Replace(file, c.from, c.to, 1)), project)
		if err != nil {
			t.Fatal(err)
		}
		err = b.Ensure(ctx, changed)
		if !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s -> %s: got %v, want a conflict naming %q", c.from, c.to, err, c.field)
		}
	}
}

// TestBootstrapFromEmulatorExport: topics and subscriptions created on
// Google's emulator, read back and written as the REST API's JSON (what
// gcloud … --format=json prints), make the same resources on our broker.
func TestBootstrapFromEmulatorExport(t *testing.T) {
	em := newClient(t, emulator(t).addr)
	ctx := context.Background()
	topic, dead := createTopic(t, em), createTopic(t, em)
	sub := createSub(t, em, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 42, EnableMessageOrdering: true,
		Labels:           map[string]string{"team": "shop"},
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dead, MaxDeliveryAttempts: 8},
		RetryPolicy:      &pb.RetryPolicy{MinimumBackoff: durationpb.New(5 * time.Second), MaximumBackoff: durationpb.New(time.Minute)},
		PushConfig:       &pb.PushConfig{PushEndpoint: "http://127.0.0.1:1/push", Wrapper: &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}}},
	})
	t.Cleanup(func() {
		em.SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: sub.Name})
	})
	var file []json.RawMessage
	for _, name := range []string{topic, dead} {
		tp, err := em.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: name})
		if err != nil {
			t.Fatal(err)
		}
		file = append(file, mustJSON(t, tp))
	}
	exported, err := em.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub.Name})
	if err != nil {
		t.Fatal(err)
	}
	file = append(file, mustJSON(t, exported))
	data, err := json.MarshalIndent(file, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	r, err := ParseResources(data, "")
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	b := startOurs(t, Options{}).ours
	for range 2 {
		if err := b.Ensure(ctx, r); err != nil {
			t.Fatalf("%v\n%s", err, data)
		}
	}
	ours, err := b.sub.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub.Name})
	if err != nil {
		t.Fatal(err)
	}
	// The emulator leaves out the output-only state, and the 31-day
	// expiration that the service gives a subscription created without one.
	ours.State = exported.State
	if exported.ExpirationPolicy == nil && ours.ExpirationPolicy.GetTtl().AsDuration() == 744*time.Hour {
		ours.ExpirationPolicy = nil
	}
	if err := differ("ours", ours, exported); err != nil {
		t.Errorf("ours differs from the emulator's: %v", err)
	}
}

func mustJSON(t *testing.T, m proto.Message) json.RawMessage {
	t.Helper()
	js, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestEnsureOlderSubscription: a subscription that an older broker stored,
// without the push_config and expiration_policy a create now fills in, is
// the one a bootstrap file without them asks for, so a broker restarted on
// its data dir with the same file still starts.
func TestEnsureOlderSubscription(t *testing.T) {
	b := startOurs(t, Options{}).ours
	ctx := context.Background()
	r, err := ParseResources([]byte("topics:\n  - name: orders\nsubscriptions:\n  - name: orders-eu\n    topic: orders\n"), project)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pub.CreateTopic(ctx, &pb.Topic{Name: topicName("orders")}); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.putSubLocked(b.nextID, b.topics[topicName("orders")], b.nextSeq, &pb.Subscription{Name: subName("orders-eu"), Topic: topicName("orders"),
		AckDeadlineSeconds: 10, MessageRetentionDuration: durationpb.New(7 * 24 * time.Hour), State: pb.Subscription_ACTIVE})
	b.mu.Unlock()
	if err := b.Ensure(ctx, r); err != nil {
		t.Errorf("ensure over an older subscription: %v", err)
	}
}

// TestParseResourcesTypoLine: a typo in a bootstrap file is reported at its
// line in the file, not at a position in the JSON the YAML became.
func TestParseResourcesTypoLine(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{"topics:\n  - name: orders\nsubscriptions:\n  - name: orders-sub\n    topic: orders\n    ackDeadlineSecond: 30\n",
			`bootstrap: line 6: subscription 1: unknown field "ackDeadlineSecond"`},
		{"- name: orders\n  labels:\n    team: shop\n- name: orders-sub\n  topic: orders\n  ackDeadlineSeconds: thirty\n",
			"bootstrap: line 6: subscription 1: "},
	} {
		_, err := ParseResources([]byte(tc.file), "shop")
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "(line 1:") {
			t.Errorf("typo:\n%s\nerror %v, want it to start %q", tc.file, err, tc.want)
		}
	}
}
