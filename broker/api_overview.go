package broker

import (
	"context"
	"maps"
	"slices"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// What the console's broker page shows and does, in process: the same
// state and the same handlers the RPCs use.

// TopicStats describes a topic and its subscriptions.
type TopicStats struct {
	Name          string
	Schema        string // its schema_settings' schema, if any
	Transforms    []TransformStats
	Subscriptions []SubscriptionStats
}

// SubscriptionStats describes a subscription's delivery state.
type SubscriptionStats struct {
	Name string
	// Backlog counts messages waiting to be delivered (or redelivered
	// after a nack's backoff); Unacked those delivered and not yet acked.
	Backlog, Unacked int
	// OldestUnacked is the age of the oldest message it still has to get
	// acknowledged; zero when it holds none.
	OldestUnacked time.Duration
	// DeadLettered counts messages moved to its dead-letter topic since
	// the broker started.
	DeadLettered int64
	// Streams counts its open StreamingPull streams (what Cloud Monitoring
	// shows as open_streaming_pulls): a subscriber that went away without
	// its streams being let go of would keep it above zero.
	Streams int

	Filter, PushEndpoint string
	Detached             bool
	Transforms           []TransformStats
	// Export is what a BigQuery or Cloud Storage subscription wrote; nil
	// for pull and push.
	Export *ExportStats
}

// Overview lists every topic with its subscriptions, by name; subscriptions
// whose topic was deleted come under the topic "_deleted-topic_".
func (b *Broker) Overview() []TopicStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.nowNanos()
	byTopic := map[string]*TopicStats{}
	for _, name := range slices.Sorted(maps.Keys(b.topics)) {
		t := b.topics[name]
		byTopic[name] = &TopicStats{Name: name, Schema: t.proto.GetSchemaSettings().GetSchema(), Transforms: t.transforms.stats()}
	}
	for _, name := range slices.Sorted(maps.Keys(b.subs)) {
		s := b.subs[name]
		tn := s.proto.Topic
		if byTopic[tn] == nil {
			byTopic[tn] = &TopicStats{Name: tn}
		}
		byTopic[tn].Subscriptions = append(byTopic[tn].Subscriptions, s.statsLocked(now))
	}
	out := make([]TopicStats, 0, len(byTopic))
	for _, name := range slices.Sorted(maps.Keys(byTopic)) {
		out = append(out, *byTopic[name])
	}
	return out
}

func (s *subscription) statsLocked(now int64) SubscriptionStats {
	st := SubscriptionStats{
		Name: s.proto.Name, DeadLettered: s.deadLettered, Streams: s.streams, Filter: s.proto.Filter,
		PushEndpoint: s.proto.GetPushConfig().GetPushEndpoint(), Detached: s.proto.Detached,
		Transforms: s.transforms.stats(), Export: s.exportStatsLocked(),
	}
	oldest := int64(0)
	older := func(m *message) {
		if oldest == 0 || m.publish < oldest {
			oldest = m.publish
		}
	}
	for _, l := range s.leases {
		if !l.backoff {
			st.Unacked++
		}
		older(l.it.m)
	}
	st.Backlog = s.held - st.Unacked
	// The queues are in publish order but for redeliveries, which go to
	// the front: their fronts hold the oldest messages.
	if s.ready.len() > 0 {
		if it := s.ready.front(); it.m != nil {
			older(it.m)
		}
	}
	for _, ks := range s.keys {
		if ks.q.len() > 0 {
			older(ks.q.front().m)
		}
	}
	if oldest != 0 {
		st.OldestUnacked = time.Duration(now - oldest)
	}
	return st
}

// Peek returns up to n messages the subscription would deliver next,
// without delivering them.
func (b *Broker) Peek(name string, n int) ([]*pb.PubsubMessage, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, err := b.sub.subscription(name)
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, status.Error(codes.InvalidArgument, "peek at least one message")
	}
	var out []*pb.PubsubMessage
	for i := 0; i < s.ready.len() && len(out) < n; i++ {
		it := s.ready.at(i)
		if it.m != nil {
			out = append(out, it.m.proto())
			continue
		}
		for j := 0; j < it.ks.q.len() && len(out) < n; j++ {
			out = append(out, it.ks.q.at(j).m.proto())
		}
	}
	return out, nil
}

// Publish publishes as the Publish RPC does, schema checks included.
func (b *Broker) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	return b.pub.Publish(ctx, req)
}

// Seek seeks as the Seek RPC does.
func (b *Broker) Seek(ctx context.Context, req *pb.SeekRequest) (*pb.SeekResponse, error) {
	return b.sub.Seek(ctx, req)
}
