package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/dedupflow/dedupflow/broker/internal/filter/filtertest"
)

// TestFilterSideBySide creates the same filtered subscriptions on our
// broker and on pstest, publishes the same messages (the filter's own
// test's, filtertest.Messages), and compares what each subscription
// delivers.
func TestFilterSideBySide(t *testing.T) {
	// Cases of the filter's own table that pstest parses as the service
	// does; it refuses or misreads others (quoted keys after a dot, say).
	filters := []string{
		`attributes:lang`,
		`attributes.lang = "en"`,
		`attributes.lang != "en"`,
		`hasPrefix(attributes.name, "co")`,
		`NOT attributes:name`,
		`attributes.name = "com" AND -attributes:"lang"`,
		`(NOT attributes:name) OR attributes.name = "co"`,
		`NOT (attributes:name OR attributes.lang = "jp")`,
		`attributes.name = "contains\"quote"`,
	}
	var mu sync.Mutex
	got := map[string][][]int{}
	// Run waits for the parallel subtests that forEachTarget starts.
	t.Run("deliver", func(t *testing.T) {
		forEachTarget(t, []string{"pstest"}, func(t *testing.T, tg target) {
			c := newClient(t, tg.addr)
			topic := createTopic(t, c)
			subs := make([]string, len(filters))
			for i, f := range filters {
				subs[i] = createSub(t, c, &pb.Subscription{Topic: topic, Filter: f}).Name
			}
			var msgs []*pubsub.Message
			for i, attrs := range filtertest.Messages() {
				a := map[string]string{"idx": fmt.Sprint(i)}
				for k, v := range attrs {
					a[k] = v
				}
				msgs = append(msgs, &pubsub.Message{Data: []byte("m"), Attributes: a})
			}
			publish(t, c, topic, msgs...)
			var res [][]int
			for _, sub := range subs {
				res = append(res, pullAllIdx(t, c, sub))
			}
			mu.Lock()
			got[tg.name] = res
			mu.Unlock()
		})
	})
	if t.Failed() {
		return
	}
	if len(got["ours"][0]) == 0 {
		t.Fatalf("%s delivered nothing", filters[0])
	}
	for i, f := range filters {
		if !slices.Equal(got["ours"][i], got["pstest"][i]) {
			t.Errorf("%s: ours delivers %v, pstest %v", f, got["ours"][i], got["pstest"][i])
		}
	}
}

// pullAllIdx pulls and acks until the subscription has nothing more and
// returns the sorted "idx" attributes it delivered.
func pullAllIdx(t *testing.T, c *pubsub.Client, sub string) []int {
	t.Helper()
	ctx := context.Background()
	var idx []int
	for empty := 0; empty < 3; {
		r, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 100, ReturnImmediately: true}) //nolint:staticcheck
		if err != nil {
			t.Fatalf("pull %s: %v", sub, err)
		}
		if len(r.ReceivedMessages) == 0 {
			empty++
			time.Sleep(50 * time.Millisecond)
			continue
		}
		var ack []string
		for _, m := range r.ReceivedMessages {
			var n int
			fmt.Sscan(m.Message.Attributes["idx"], &n)
			idx = append(idx, n)
			ack = append(ack, m.AckId)
		}
		if err := c.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: ack}); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(idx)
	return idx
}

// TestFilterRejected: filters the service rejects, side by side with
// pstest. pstest's general parser accepts filters that mix AND and OR
// without parentheses, filters over 256 bytes and a value that is a bare
// word instead of a string literal; the service's documentation rejects
// all three, and so do we.
func TestFilterRejected(t *testing.T) {
	ps := newClient(t, startPstest(t).addr)
	psTopic := createTopic(t, ps)
	c := newClient(t, startOurs(t, Options{}).addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	for _, f := range []struct {
		filter       string
		pstestAccept bool
	}{
		{`attributes:a AND attributes:b OR attributes:c`, true},
		{"attributes:" + strings.Repeat("k", 300), true},
		{`attributes.a = x`, true},
		{`(attributes:a`, false},
	} {
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic, AckDeadlineSeconds: 10, Filter: f.filter})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "invalid filter") {
			t.Errorf("filter %.40q: got %v, want InvalidArgument naming the filter", f.filter, err)
		}
		_, err = ps.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: psTopic, AckDeadlineSeconds: 10, Filter: f.filter})
		if accepted := err == nil; accepted != f.pstestAccept {
			t.Errorf("filter %.40q: pstest answers %v; the test expects it to accept: %v", f.filter, err, f.pstestAccept)
		}
	}
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: `attributes:a`})
	_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, Filter: `attributes:b`},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"filter"}},
	})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "the filter field") {
		t.Errorf("update of the filter: got %v, want InvalidArgument naming the field", err)
	}
}

// TestFilterSkipsDeliveryAndDeadLetter: a message the filter rejects is
// acknowledged at once: StreamingPull never sees it, it is not held in the
// backlog, and it never reaches the dead-letter topic, however often the
// matching messages are nacked.
func TestFilterSkipsDeliveryAndDeadLetter(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	dlTopic := createTopic(t, c)
	dl := createSub(t, c, &pb.Subscription{Topic: dlTopic})
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: `attributes.kind = "keep"`,
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dlTopic, MaxDeliveryAttempts: 5}})
	var msgs []*pubsub.Message
	for i := range 10 {
		kind := "drop"
		if i%2 == 0 {
			kind = "keep"
		}
		msgs = append(msgs, &pubsub.Message{Data: []byte("x"), Attributes: map[string]string{"kind": kind, "idx": fmt.Sprint(i)}})
	}
	publish(t, c, topic, msgs...)
	tg.ours.mu.Lock()
	held := tg.ours.subs[sub.Name].held
	tg.ours.mu.Unlock()
	if held != 5 {
		t.Errorf("the subscription holds %d messages, want the 5 that match", held)
	}
	seen := map[string]int{}
	receive(t, c, sub.Name, 30*time.Second, nil, func(m *pubsub.Message) (bool, bool) {
		if m.Attributes["kind"] != "keep" {
			t.Errorf("message %s delivered although the filter rejects it", m.Attributes["idx"])
		}
		seen[m.Attributes["idx"]]++
		return false, len(seen) == 5 && minCount(seen) >= 5
	})
	got := pullAllIdx(t, c, dl.Name)
	if !slices.Equal(got, []int{0, 2, 4, 6, 8}) {
		t.Errorf("dead-lettered %v, want only the matching messages 0 2 4 6 8", got)
	}
}

func minCount(m map[string]int) int {
	n := -1
	for _, v := range m {
		if n < 0 || v < n {
			n = v
		}
	}
	return n
}

// TestFilterPush: a push subscription's filter keeps what does not match
// from ever reaching the endpoint.
func TestFilterPush(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	e := newEndpoint(t, always(200))
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: `attributes.kind = "keep"`,
		PushConfig: &pb.PushConfig{PushEndpoint: e.URL + "/push"}})
	var msgs []*pubsub.Message
	for i := range 6 {
		kind := map[bool]string{true: "keep", false: "drop"}[i%2 == 0]
		msgs = append(msgs, &pubsub.Message{Data: []byte("x"), Attributes: map[string]string{"kind": kind, "idx": fmt.Sprint(i)}})
	}
	publish(t, c, topic, msgs...)
	var got []string
	for range 3 {
		w := decodeWrapped(t, e.next(t, 10*time.Second))
		if w.Message.Attributes["kind"] != "keep" {
			t.Errorf("pushed %v although the filter rejects it", w.Message.Attributes)
		}
		got = append(got, w.Message.Attributes["idx"])
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"0", "2", "4"}) {
		t.Errorf("pushed %v, want 0 2 4", got)
	}
	// Once the three are acknowledged nothing is left to push: the others
	// were never queued.
	for end := time.Now().Add(10 * time.Second); ; {
		tg.ours.mu.Lock()
		held := tg.ours.subs[sub.Name].held
		tg.ours.mu.Unlock()
		if held == 0 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the subscription still holds %d messages", held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case p := <-e.got:
		t.Errorf("a fourth push: %s", p.body)
	default:
	}
}
