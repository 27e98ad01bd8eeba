package broker

import (
	"context"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestOverview checks the figures the broker page shows.
func TestOverview(t *testing.T) {
	tg := startOurs(t, Options{})
	ctx := context.Background()
	c := newClient(t, tg.addr)
	topic, dead := createTopic(t, c), createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: `attributes.kind = "a"`,
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dead, MaxDeliveryAttempts: 5}}).Name
	publish(t, c, topic, &pubsub.Message{Data: []byte("1"), Attributes: map[string]string{"kind": "a"}},
		&pubsub.Message{Data: []byte("2"), Attributes: map[string]string{"kind": "a"}},
		&pubsub.Message{Data: []byte("3"), Attributes: map[string]string{"kind": "a"}})
	tg.clock.Advance(time.Minute)
	stats := func() SubscriptionStats {
		for _, ts := range tg.ours.Overview() {
			for _, s := range ts.Subscriptions {
				if s.Name == sub {
					if ts.Name != topic {
						t.Fatalf("%s listed under %s, want %s", sub, ts.Name, topic)
					}
					return s
				}
			}
		}
		t.Fatalf("%s not in the overview", sub)
		return SubscriptionStats{}
	}
	if peek, err := tg.ours.Peek(sub, 2); err != nil || len(peek) != 2 || string(peek[0].Data) != "1" {
		t.Fatalf("peek: %v %v, want the first two messages", peek, err)
	}
	// Five deliveries of the first message, each nacked: dead-lettered.
	for range 5 {
		m := pullOne(t, c, sub, 5*time.Second)
		if s := stats(); s.Unacked != 1 || s.Backlog != 2 {
			t.Fatalf("with one message out: %+v, want 1 unacked and 2 in the backlog", s)
		}
		if err := c.SubscriptionAdminClient.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: []string{m.AckId}}); err != nil {
			t.Fatal(err)
		}
	}
	s := stats()
	if s.DeadLettered != 1 || s.Backlog != 2 || s.Unacked != 0 || s.Filter != `attributes.kind = "a"` || s.OldestUnacked < time.Minute {
		t.Fatalf("after dead-lettering one: %+v, want 1 dead-lettered, a backlog of 2, its filter, and an age of a minute or more", s)
	}
}
