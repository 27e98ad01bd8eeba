package broker

import (
	"context"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
)

// subscriberServer implements google.pubsub.v1.Subscriber (snapshots are in
// snapshot.go, push delivery in push.go).
type subscriberServer struct {
	pb.UnimplementedSubscriberServer
	b *Broker
}

// subscription finds a live subscription; b.mu must be held.
func (srv *subscriberServer) subscription(name string) (*subscription, error) {
	if _, _, err := parseName(name, "subscriptions"); err != nil {
		return nil, err
	}
	s := srv.b.subs[name]
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "subscription not found: %s", name)
	}
	return s, nil
}

// resource is the subscription as the API answers it.
func (s *subscription) resource() *pb.Subscription { return s.proto }

// detachedError is what Pull and StreamingPull answer on a detached
// subscription, as the proto says.
func detachedError(s *subscription) error {
	return status.Errorf(codes.FailedPrecondition, "subscription %s is detached from its topic", s.proto.Name)
}

// deadLetterTopicLocked refuses a dead-letter policy whose topic does not
// exist; b.mu must be held.
func (b *Broker) deadLetterTopicLocked(sp *pb.Subscription) error {
	if dl := sp.DeadLetterPolicy; dl != nil && b.topics[dl.DeadLetterTopic] == nil {
		return status.Errorf(codes.NotFound, "dead-letter topic not found: %s", dl.DeadLetterTopic)
	}
	return nil
}

func (srv *subscriberServer) CreateSubscription(ctx context.Context, req *pb.Subscription) (*pb.Subscription, error) {
	if _, _, err := parseName(req.Name, "subscriptions"); err != nil {
		return nil, err
	}
	if _, _, err := parseName(req.Topic, "topics"); err != nil {
		return nil, err
	}
	sp := proto.Clone(req).(*pb.Subscription)
	clearNotStored(sp.ProtoReflect())
	sp.Detached = false // only DetachSubscription detaches
	if err := checkSubscriptionConfig(sp); err != nil {
		return nil, err
	}
	sp.State = pb.Subscription_ACTIVE
	b := srv.b
	out, err := changeTo(ctx, b, func() (*pb.Subscription, error) {
		if b.subs[req.Name] != nil {
			return nil, status.Errorf(codes.AlreadyExists, "subscription %s already exists", req.Name)
		}
		t := b.topics[req.Topic]
		if t == nil {
			return nil, status.Errorf(codes.NotFound, "topic not found: %s", req.Topic)
		}
		if err := b.deadLetterTopicLocked(sp); err != nil {
			return nil, err
		}
		// firstSeq = nextSeq: nothing published before this point is delivered.
		s := b.putSubLocked(b.nextID, t, b.nextSeq, sp)
		return proto.Clone(s.proto).(*pb.Subscription), nil
	})
	if err != nil {
		return nil, err
	}
	b.log.Debug("subscription created", "subscription", req.Name, "topic", req.Topic)
	return out, nil
}

func (srv *subscriberServer) GetSubscription(_ context.Context, req *pb.GetSubscriptionRequest) (*pb.Subscription, error) {
	return get(srv.b, req.Subscription, srv.subscription, (*subscription).resource)
}

func (srv *subscriberServer) UpdateSubscription(ctx context.Context, req *pb.UpdateSubscriptionRequest) (*pb.Subscription, error) {
	b := srv.b
	return changeTo(ctx, b, func() (*pb.Subscription, error) {
		s, err := srv.subscription(req.GetSubscription().GetName())
		if err != nil {
			return nil, err
		}
		sp := proto.Clone(s.proto).(*pb.Subscription)
		// Ordering cannot change: queued messages are laid out for one mode.
		// The filter is fixed at creation, as in the service.
		if err := applyMask(sp, req.Subscription, req.UpdateMask, "topic", "enable_message_ordering", "filter", "detached"); err != nil {
			return nil, err
		}
		if err := checkSubscriptionConfig(sp); err != nil {
			return nil, err
		}
		if err := b.deadLetterTopicLocked(sp); err != nil {
			return nil, err
		}
		b.putSubLocked(s.id, s.topic, s.firstSeq, sp)
		return proto.Clone(sp).(*pb.Subscription), nil
	})
}

func (srv *subscriberServer) ListSubscriptions(_ context.Context, req *pb.ListSubscriptionsRequest) (*pb.ListSubscriptionsResponse, error) {
	b := srv.b
	subs, next, err := list(b, req.Project, "subscriptions", req.PageSize, req.PageToken, func() map[string]*subscription { return b.subs }, (*subscription).resource)
	if err != nil {
		return nil, err
	}
	return &pb.ListSubscriptionsResponse{Subscriptions: subs, NextPageToken: next}, nil
}

func (srv *subscriberServer) DeleteSubscription(ctx context.Context, req *pb.DeleteSubscriptionRequest) (*emptypb.Empty, error) {
	return remove(ctx, srv.b, req.Subscription, srv.subscription, srv.b.deleteSubLocked)
}

// ModifyPushConfig switches a subscription between push (an endpoint) and
// pull (an empty config), or changes where and how it pushes.
func (srv *subscriberServer) ModifyPushConfig(ctx context.Context, req *pb.ModifyPushConfigRequest) (*emptypb.Empty, error) {
	if err := checkPushConfig(req.PushConfig); err != nil {
		return nil, err
	}
	b := srv.b
	return b.changeEmpty(ctx, func() error {
		s, err := srv.subscription(req.Subscription)
		if err != nil {
			return err
		}
		sp := proto.Clone(s.proto).(*pb.Subscription)
		sp.PushConfig = &pb.PushConfig{}
		if req.PushConfig != nil {
			sp.PushConfig = proto.Clone(req.PushConfig).(*pb.PushConfig)
		}
		b.putSubLocked(s.id, s.topic, s.firstSeq, sp)
		return nil
	})
}

// Pull returns what is available, waiting up to Options.PullWait for the
// first message unless return_immediately is set.
func (srv *subscriberServer) Pull(ctx context.Context, req *pb.PullRequest) (*pb.PullResponse, error) {
	if req.MaxMessages <= 0 {
		return nil, status.Error(codes.InvalidArgument, "max_messages must be positive")
	}
	b := srv.b
	timer := time.NewTimer(b.opts.PullWait)
	defer timer.Stop()
	wake := make(chan struct{}, 1)
	for {
		b.mu.Lock()
		s, err := srv.subscription(req.Subscription)
		if err == nil && s.proto.Detached {
			err = detachedError(s)
		}
		if err != nil {
			b.mu.Unlock()
			return nil, err
		}
		b.fireTimersLocked(b.nowNanos())
		deadline := time.Duration(s.proto.AckDeadlineSeconds) * time.Second
		ds := b.deliverLocked(s, int(min(req.MaxMessages, 10000)), limits.RequestBytes, deadline, nil, nil)
		//lint:ignore SA1019 deprecated in the API, yet still sent by clients and honoured by the service
		if len(ds) > 0 || req.ReturnImmediately {
			ts := s.transforms
			b.mu.Unlock()
			if ts != nil && len(ds) > 0 {
				//lint:ignore SA1019 as above
				if ds = b.transformDeliveries(s, ts, ds); len(ds) == 0 && !req.ReturnImmediately {
					continue
				}
			}
			msgs := make([]*pb.ReceivedMessage, len(ds))
			for i, d := range ds {
				msgs[i] = d.proto()
			}
			return &pb.PullResponse{ReceivedMessages: msgs}, nil
		}
		s.waiters[wake] = struct{}{}
		b.mu.Unlock()
		var done bool
		select {
		case <-wake:
		case <-timer.C:
			done = true
		case <-ctx.Done():
			done = true
		case <-b.closing:
			done = true
		}
		b.mu.Lock()
		delete(s.waiters, wake)
		b.mu.Unlock()
		if done {
			return &pb.PullResponse{}, nil
		}
	}
}

// ackFailure is the per-ack-ID reason the Go, Java and Python clients read
// from the ErrorInfo metadata when exactly-once delivery is on.
const ackFailure = "PERMANENT_FAILURE_INVALID_ACK_ID"

// eodError reports ack IDs that could not be acknowledged or modified,
// with the ErrorInfo the clients read. When every ack ID failed the code is
// InvalidArgument. When only some did, the code is Aborted: the clients
// complete the listed ones with their failure and retry the others (and
// gax does not retry Aborted by itself); the retry succeeds because an ack
// ID acknowledged moments ago is acknowledged again without error.
func eodError(failed map[string]string, total int) error {
	code := codes.InvalidArgument
	if len(failed) < total {
		code = codes.Aborted
	}
	st := status.New(code, "some ack IDs are invalid or expired (exactly-once delivery)")
	st, err := st.WithDetails(&errdetails.ErrorInfo{
		Reason:   "EXACTLY_ONCE_ACKID_FAILURE",
		Domain:   "pubsub.googleapis.com",
		Metadata: failed,
	})
	if err != nil {
		return status.Errorf(codes.Internal, "build ack error details: %v", err)
	}
	return st.Err()
}

// onAckIDs checks ackIDs and runs fn on the subscription under b.mu; the
// ack IDs fn says failed are answered as eodError says.
func (srv *subscriberServer) onAckIDs(name string, ackIDs []string, fn func(s *subscription) (failed map[string]string)) error {
	if err := checkAckIDs(ackIDs); err != nil {
		return err
	}
	b := srv.b
	b.mu.Lock()
	s, err := srv.subscription(name)
	if err != nil {
		b.mu.Unlock()
		return err
	}
	failed := fn(s)
	b.mu.Unlock()
	if len(failed) > 0 {
		return eodError(failed, len(ackIDs))
	}
	return nil
}

func (srv *subscriberServer) Acknowledge(ctx context.Context, req *pb.AcknowledgeRequest) (*emptypb.Empty, error) {
	b := srv.b
	var (
		eod bool
		off uint64
	)
	err := srv.onAckIDs(req.Subscription, req.AckIds, func(s *subscription) map[string]string {
		failed := b.ackLocked(s, req.AckIds)
		eod, off = s.exactlyOnce(), b.offsetLocked()
		return failed
	})
	if err != nil {
		return nil, err
	}
	// With exactly-once delivery a successful ack is a promise that the
	// message does not come back, so it has to be durable first. Otherwise
	// a lost ack only means a redelivery, which at-least-once allows.
	if eod {
		return &emptypb.Empty{}, durable(ctx, b, off)
	}
	return &emptypb.Empty{}, nil
}

func (srv *subscriberServer) ModifyAckDeadline(_ context.Context, req *pb.ModifyAckDeadlineRequest) (*emptypb.Empty, error) {
	if req.AckDeadlineSeconds < 0 || req.AckDeadlineSeconds > maxAckDeadline {
		return nil, status.Errorf(codes.InvalidArgument, "ack_deadline_seconds is %d, it must be between 0 and %d", req.AckDeadlineSeconds, maxAckDeadline)
	}
	err := srv.onAckIDs(req.Subscription, req.AckIds, func(s *subscription) map[string]string {
		return srv.b.modAckLocked(s, req.AckIds, req.AckDeadlineSeconds)
	})
	if err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

func (srv *subscriberServer) Seek(ctx context.Context, req *pb.SeekRequest) (*pb.SeekResponse, error) {
	b := srv.b
	err := b.change(ctx, func() error {
		s, err := srv.subscription(req.Subscription)
		if err != nil {
			return err
		}
		switch v := req.Target.(type) {
		case *pb.SeekRequest_Time:
			b.seekLocked(s, unixNanos(v.Time.AsTime()))
			return nil
		case *pb.SeekRequest_Snapshot:
			return srv.seekToSnapshotLocked(s, v.Snapshot)
		default:
			return status.Error(codes.InvalidArgument, "seek needs a time or a snapshot")
		}
	})
	if err != nil {
		return nil, err
	}
	return &pb.SeekResponse{}, nil
}

// ackLocked acknowledges ackIDs on s. It returns, for exactly-once
// subscriptions only, the ack IDs that are not valid any more.
func (b *Broker) ackLocked(s *subscription, ackIDs []string) map[string]string {
	return b.leasesLocked(s, ackIDs, s.recentlyAcked, func(l *lease, now int64) {
		b.ackLeaseLocked(l)
		if s.exactlyOnce() {
			s.rememberAck(l.id, now)
		}
	})
}

// modAckLocked sets the deadline of the leases of ackIDs on s to seconds
// from now, or nacks them for 0. It returns what ackLocked returns, but
// for every ack ID without a lease.
func (b *Broker) modAckLocked(s *subscription, ackIDs []string, seconds int32) map[string]string {
	return b.leasesLocked(s, ackIDs, nil, func(l *lease, now int64) {
		if seconds == 0 {
			b.nackLocked(l, now)
			return
		}
		l.at = now + int64(seconds)*int64(time.Second)
		b.timers.fix(l)
	})
}

// leasesLocked calls fn with the lease of each of ackIDs on s, once the
// deadlines due have fired (a call that arrives after its deadline is
// late). For exactly-once subscriptions only, it returns the ack IDs with
// no lease that excused (when not nil) does not excuse.
func (b *Broker) leasesLocked(s *subscription, ackIDs []string, excused func(ackID string) bool, fn func(l *lease, now int64)) map[string]string {
	now := b.nowNanos()
	b.fireTimersLocked(now)
	var failed map[string]string
	for _, id := range ackIDs {
		l := s.lookupLease(id)
		if l == nil {
			if s.exactlyOnce() && (excused == nil || !excused(id)) {
				if failed == nil {
					failed = map[string]string{}
				}
				failed[id] = ackFailure
			}
			continue
		}
		fn(l, now)
	}
	return failed
}
