package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Tests of ours only, driven by the injected clock.

func pullN(t *testing.T, c *pubsub.Client, sub string, n int32) []*pb.ReceivedMessage {
	t.Helper()
	r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub, MaxMessages: n, ReturnImmediately: true}) //nolint:staticcheck
	if err != nil {
		t.Fatal(err)
	}
	return r.ReceivedMessages
}

func nack(t *testing.T, c *pubsub.Client, sub string, ms ...*pb.ReceivedMessage) {
	t.Helper()
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.AckId)
	}
	if err := c.SubscriptionAdminClient.ModifyAckDeadline(context.Background(), &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: ids}); err != nil {
		t.Fatal(err)
	}
}

func TestRetryPolicyBackoff(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, RetryPolicy: &pb.RetryPolicy{
		MinimumBackoff: durationpb.New(10 * time.Second), MaximumBackoff: durationpb.New(15 * time.Second)}})
	publish(t, c, topic, &pubsub.Message{Data: []byte("x")})
	m := pullN(t, c, sub.Name, 1)
	nack(t, c, sub.Name, m...)
	if got := pullN(t, c, sub.Name, 1); len(got) != 0 {
		t.Fatal("redelivered before the minimum backoff")
	}
	tg.sleep(11 * time.Second)
	m = pullN(t, c, sub.Name, 1)
	if len(m) != 1 {
		t.Fatal("not redelivered after the minimum backoff")
	}
	nack(t, c, sub.Name, m...)
	tg.sleep(11 * time.Second) // the second backoff is 20s, capped at 15s
	if got := pullN(t, c, sub.Name, 1); len(got) != 0 {
		t.Fatal("redelivered before the second backoff")
	}
	tg.sleep(5 * time.Second)
	if got := pullN(t, c, sub.Name, 1); len(got) != 1 {
		t.Fatal("not redelivered after the maximum backoff")
	}
}

func TestOrderingNackRedeliversInOrder(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, EnableMessageOrdering: true})
	var msgs []*pubsub.Message
	for i := range 3 {
		msgs = append(msgs, &pubsub.Message{Data: fmt.Appendf(nil, "%d", i), OrderingKey: "k"})
	}
	p := c.Publisher(topic)
	p.EnableMessageOrdering = true
	for _, m := range msgs {
		if _, err := p.Publish(context.Background(), m).Get(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	publish(t, c, topic, &pubsub.Message{Data: []byte("unordered")})
	first := pullN(t, c, sub.Name, 10)
	if len(first) != 4 {
		t.Fatalf("first pull got %d messages, want the key's batch of 3 and 1 without key", len(first))
	}
	// While the batch is out, nothing more of the key is delivered.
	if _, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic,
		Messages: []*pb.PubsubMessage{{Data: []byte("3"), OrderingKey: "k"}}}); err != nil {
		t.Fatal(err)
	}
	if got := pullN(t, c, sub.Name, 10); len(got) != 0 {
		t.Fatalf("delivered %d messages of a busy key", len(got))
	}
	nack(t, c, sub.Name, first[1]) // "1"
	if err := c.SubscriptionAdminClient.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: sub.Name,
		AckIds: []string{first[0].AckId, first[2].AckId, first[3].AckId}}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range pullN(t, c, sub.Name, 10) {
		got = append(got, string(m.Message.Data))
	}
	if fmt.Sprint(got) != "[1 3]" {
		t.Errorf("after nack got %v, want [1 3]", got)
	}
}

func TestDeliveryDoesNotScanBacklog(t *testing.T) {
	// A large backlog must not make single pulls slower: time pulls with a
	// small and a 50x larger backlog.
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	timePulls := func(backlog int) time.Duration {
		topic := createTopic(t, c)
		sub := createSub(t, c, &pb.Subscription{Topic: topic})
		msgs := make([]*pb.PubsubMessage, 1000)
		for i := range msgs {
			msgs[i] = &pb.PubsubMessage{Data: []byte("x")}
		}
		for i := 0; i < backlog; i += len(msgs) {
			if _, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic, Messages: msgs}); err != nil {
				t.Fatal(err)
			}
		}
		b := tg.ours
		b.mu.Lock()
		defer b.mu.Unlock()
		s := b.subs[sub.Name]
		start := time.Now()
		for range 2000 {
			for _, d := range b.deliverLocked(s, 1, 1<<20, time.Minute, nil, nil) {
				b.ackLocked(s, []string{ackIDOf(d.ackID)})
			}
		}
		return time.Since(start)
	}
	// The best of three runs each, so that a busy machine does not decide;
	// a scan per pull would make the large backlog about 50 times slower.
	best := func(backlog int) time.Duration {
		d := timePulls(backlog)
		for range 2 {
			d = min(d, timePulls(backlog))
		}
		return d
	}
	small, large := best(2000), best(100_000)
	t.Logf("2000 pull+ack: %v with a backlog of 2k, %v with 100k", small, large)
	if large > 10*small+50*time.Millisecond {
		t.Errorf("delivery slows down with the backlog: %v vs %v", large, small)
	}
}

func TestDequeAndHeap(t *testing.T) {
	var d deque[int]
	for i := range 100 {
		d.pushBack(i)
	}
	d.pushFront(-1)
	d.insertSorted(50, func(a, b int) bool { return a < b })
	if d.len() != 102 || d.front() != -1 || d.at(52) != 50 || d.at(51) != 50 {
		t.Fatalf("deque: len %d front %d at51 %d at52 %d", d.len(), d.front(), d.at(51), d.at(52))
	}
	for i := -1; i < 100; i++ {
		if v := d.popFront(); v != i {
			t.Fatalf("pop %d, want %d", v, i)
		}
		if i == 50 {
			d.popFront() // the inserted duplicate
		}
	}
	var h timerHeap
	var ls []*lease
	for _, at := range []int64{5, 3, 9, 1, 7} {
		l := &lease{at: at}
		ls = append(ls, l)
		h.push(l)
	}
	h.remove(ls[2]) // 9
	ls[0].at = 0    // 5 -> 0
	h.fix(ls[0])
	var order []int64
	for len(h) > 0 {
		order = append(order, h[0].at)
		h.remove(h[0])
	}
	if fmt.Sprint(order) != "[0 1 3 7]" {
		t.Errorf("heap order %v", order)
	}
}
