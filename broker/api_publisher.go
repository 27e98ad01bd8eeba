package broker

import (
	"context"
	"fmt"
	"slices"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/wire"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// publisherServer implements google.pubsub.v1.Publisher.
type publisherServer struct {
	pb.UnimplementedPublisherServer
	b *Broker
}

// durable turns a failure to reach durability into a status the clients
// retry (Unavailable), after the state change already happened in memory.
func durable(ctx context.Context, b *Broker, off uint64) error {
	if b.wal == nil {
		return nil
	}
	if err := b.wal.wait(ctx, off); err != nil {
		return status.Errorf(codes.Unavailable, "the change is not known to be durable: %v", err)
	}
	return nil
}

func (b *Broker) offsetLocked() uint64 {
	if b.wal == nil {
		return 0
	}
	return b.wal.offset()
}

func (p *publisherServer) CreateTopic(ctx context.Context, req *pb.Topic) (*pb.Topic, error) {
	if _, _, err := parseName(req.Name, "topics"); err != nil {
		return nil, err
	}
	if req.IngestionDataSourceSettings != nil {
		return nil, status.Error(codes.Unimplemented, "ingestion sources are not supported by this broker")
	}
	if err := checkTopicConfig(req); err != nil {
		return nil, err
	}
	b := p.b
	out, err := changeTo(ctx, b, func() (*pb.Topic, error) {
		if b.topics[req.Name] != nil {
			return nil, status.Errorf(codes.AlreadyExists, "topic %s already exists", req.Name)
		}
		if err := b.checkSchemaSettingsLocked(req.SchemaSettings); err != nil {
			return nil, err
		}
		tp := proto.Clone(req).(*pb.Topic)
		clearNotStored(tp.ProtoReflect())
		tp.State = pb.Topic_ACTIVE
		b.putTopicLocked(b.nextID, tp)
		return proto.Clone(tp).(*pb.Topic), nil
	})
	if err != nil {
		return nil, err
	}
	b.log.Debug("topic created", "topic", req.Name)
	return out, nil
}

func (p *publisherServer) topic(name string) (*topic, error) {
	if _, _, err := parseName(name, "topics"); err != nil {
		return nil, err
	}
	t := p.b.topics[name]
	if t == nil {
		return nil, status.Errorf(codes.NotFound, "topic not found: %s", name)
	}
	return t, nil
}

// resource is the topic as the API answers it.
func (t *topic) resource() *pb.Topic { return t.proto }

func (p *publisherServer) GetTopic(_ context.Context, req *pb.GetTopicRequest) (*pb.Topic, error) {
	return get(p.b, req.Topic, p.topic, (*topic).resource)
}

func (p *publisherServer) UpdateTopic(ctx context.Context, req *pb.UpdateTopicRequest) (*pb.Topic, error) {
	b := p.b
	return changeTo(ctx, b, func() (*pb.Topic, error) {
		t, err := p.topic(req.GetTopic().GetName())
		if err != nil {
			return nil, err
		}
		tp := proto.Clone(t.proto).(*pb.Topic)
		if err := applyMask(tp, req.Topic, req.UpdateMask); err != nil {
			return nil, err
		}
		if err := checkTopicConfig(tp); err != nil {
			return nil, err
		}
		if err := b.checkSchemaSettingsLocked(tp.SchemaSettings); err != nil {
			return nil, err
		}
		b.putTopicLocked(t.id, tp)
		return proto.Clone(tp).(*pb.Topic), nil
	})
}

func (p *publisherServer) ListTopics(_ context.Context, req *pb.ListTopicsRequest) (*pb.ListTopicsResponse, error) {
	b := p.b
	topics, next, err := list(b, req.Project, "topics", req.PageSize, req.PageToken, func() map[string]*topic { return b.topics }, (*topic).resource)
	if err != nil {
		return nil, err
	}
	return &pb.ListTopicsResponse{Topics: topics, NextPageToken: next}, nil
}

func (p *publisherServer) ListTopicSubscriptions(_ context.Context, req *pb.ListTopicSubscriptionsRequest) (*pb.ListTopicSubscriptionsResponse, error) {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := p.topic(req.Topic)
	if err != nil {
		return nil, err
	}
	var all []string
	for _, s := range t.subs {
		all = append(all, s.proto.Name)
	}
	slices.Sort(all)
	names, next, err := page(all, req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	return &pb.ListTopicSubscriptionsResponse{Subscriptions: names, NextPageToken: next}, nil
}

func (p *publisherServer) ListTopicSnapshots(_ context.Context, req *pb.ListTopicSnapshotsRequest) (*pb.ListTopicSnapshotsResponse, error) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	t, err := p.topic(req.Topic)
	if err != nil {
		return nil, err
	}
	names, next, err := page(p.b.topicSnapshotsLocked(t), req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	return &pb.ListTopicSnapshotsResponse{Snapshots: names, NextPageToken: next}, nil
}

func (p *publisherServer) DeleteTopic(ctx context.Context, req *pb.DeleteTopicRequest) (*emptypb.Empty, error) {
	return remove(ctx, p.b, req.Topic, p.topic, p.b.deleteTopicLocked)
}

func (p *publisherServer) DetachSubscription(ctx context.Context, req *pb.DetachSubscriptionRequest) (*pb.DetachSubscriptionResponse, error) {
	b := p.b
	err := b.change(ctx, func() error {
		s, err := b.sub.subscription(req.Subscription)
		if err != nil {
			return err
		}
		// A detached subscription keeps its settings but loses its backlog
		// and receives nothing more.
		b.resetSubLocked(s)
		sp := proto.Clone(s.proto).(*pb.Subscription)
		sp.Detached = true
		b.putSubLocked(s.id, nil, s.firstSeq, sp)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &pb.DetachSubscriptionResponse{}, nil
}

// Publish stores the messages and answers once they are durable.
func (p *publisherServer) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	if len(req.Messages) == 0 {
		return nil, status.Error(codes.InvalidArgument, "a publish request needs at least one message")
	}
	if len(req.Messages) > limits.RequestMessages {
		return nil, status.Errorf(codes.InvalidArgument, "Too many messages to publish: %d, the limit is %d per request", len(req.Messages), limits.RequestMessages)
	}
	// The sizes of data and attributes stand in for the request size:
	// proto.Size would walk every attribute map a second time.
	total := 0
	sizes := make([]int, len(req.Messages))
	for i, m := range req.Messages {
		n, err := checkMessage(i, m)
		if err != nil {
			return nil, err
		}
		sizes[i] = n
		total += n
	}
	if total > limits.RequestBytes {
		return nil, status.Errorf(codes.InvalidArgument, "publish request carries %d bytes, the limit is %d", total, limits.RequestBytes)
	}
	checked, msgs, sizes, err := p.b.transformPublish(req, sizes)
	if err != nil {
		return nil, err
	}
	if err := p.b.checkSchema(checked); err != nil {
		return nil, err
	}
	// Encoded before the lock is taken, so that other requests do not wait
	// for it.
	bodies := make([][]byte, len(msgs))
	for i, m := range msgs {
		if m != nil {
			bodies[i] = wire.Body(m.Data, m.Attributes)
		}
	}
	b := p.b
	ids := make([]string, len(req.Messages))
	b.mu.Lock()
	t, err := p.topic(req.Topic)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	now := b.nowNanos()
	for i, m := range msgs {
		if m == nil {
			ids[i] = b.filteredIDLocked()
			continue
		}
		ids[i] = b.publishLocked(t, bodies[i], m.OrderingKey, sizes[i], now).id()
	}
	off := b.offsetLocked()
	b.mu.Unlock()
	if err := durable(ctx, b, off); err != nil {
		return nil, fmt.Errorf("publish to %s: %w", req.Topic, err)
	}
	return &pb.PublishResponse{MessageIds: ids}, nil
}
