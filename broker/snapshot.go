package broker

import (
	"context"
	"encoding/binary"
	"slices"
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Snapshots, as the service documents them: a snapshot keeps the messages
// its subscription had not acknowledged when it was taken, and every
// message published to the topic after that, so seeking a subscription of
// the same topic to it makes exactly those unacknowledged again. It lives
// 7 days minus the age of the oldest message it keeps, and the service
// refuses one that would live less than an hour.
const (
	snapshotLife    = 7 * 24 * time.Hour
	minSnapshotLife = time.Hour
)

type snapshot struct {
	id    uint64
	proto *pb.Snapshot
	topic *topic // nil once the topic is deleted
	// msgs are in publish order: the backlog at creation, then what the
	// topic received since (appended by fanoutLocked).
	msgs deque[*message]
}

// resource is the snapshot as the API answers it.
func (sn *snapshot) resource() *pb.Snapshot { return sn.proto }

func (sn *snapshot) expired(now int64) bool {
	return !sn.proto.ExpireTime.AsTime().After(time.Unix(0, now))
}

// newSnapshotLocked takes a snapshot of s's unacknowledged messages at now.
// Messages already past s's retention are left out: they will never be
// delivered again.
func (b *Broker) newSnapshotLocked(id uint64, s *subscription, now int64, sp *pb.Snapshot) *snapshot {
	cutoff := now - int64(s.retention())
	var held []*message
	s.forEachHeld(func(m *message) {
		if m.publish >= cutoff {
			held = append(held, m)
		}
	})
	slices.SortFunc(held, func(a, b *message) int { return cmpSeq(a.seq, b.seq) })
	sn := b.putSnapshotLocked(id, s.topic, sp)
	for _, m := range held {
		sn.msgs.pushBack(m)
	}
	b.logRecord(recSnap, func(d []byte) []byte { return appendSnap(d, sn, s.id, now) })
	return sn
}

// putSnapshotLocked registers a snapshot of t (nil: its topic is gone).
func (b *Broker) putSnapshotLocked(id uint64, t *topic, sp *pb.Snapshot) *snapshot {
	sn := &snapshot{id: id, proto: sp, topic: t}
	b.snaps[sp.Name] = sn
	b.snapByID[id] = sn
	b.nextID = max(b.nextID, id+1)
	if t != nil {
		if t.snaps == nil {
			t.snaps = map[uint64]*snapshot{}
		}
		t.snaps[id] = sn
	}
	return sn
}

func (b *Broker) deleteSnapshotLocked(sn *snapshot) {
	b.logDelete(recSnapDel, sn.id)
	b.dropPolicyLocked(sn.proto.Name)
	delete(b.snaps, sn.proto.Name)
	delete(b.snapByID, sn.id)
	if sn.topic != nil {
		delete(sn.topic.snaps, sn.id)
	}
}

// detachSnapshotsLocked keeps t's snapshots after t is deleted, as the
// service does; they can no longer be sought to.
func detachSnapshotsLocked(t *topic) {
	for _, sn := range t.snaps {
		sn.topic = nil
		sn.proto.Topic = deletedTopic
	}
	t.snaps = nil
}

// pruneSnapshotsLocked deletes the snapshots that have expired.
func (b *Broker) pruneSnapshotsLocked(now int64) {
	for _, sn := range b.snapByID {
		if sn.expired(now) {
			b.deleteSnapshotLocked(sn)
		}
	}
}

// seekSnapshotLocked makes s hold exactly what sn keeps (that s's filter
// passes), all of it unacknowledged.
func (b *Broker) seekSnapshotLocked(s *subscription, sn *snapshot) {
	b.logRecord(recSeekSnap, func(d []byte) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(d, s.id), sn.id)
	})
	b.resetSubLocked(s)
	for i := 0; i < sn.msgs.len(); i++ {
		if m := sn.msgs.at(i); s.filter.Match(m.body) {
			s.held++
			s.enqueueLocked(item{m: m}, false)
		}
	}
	s.notify()
}

// snapshot finds a live snapshot; b.mu must be held.
func (srv *subscriberServer) snapshot(name string) (*snapshot, error) {
	if _, _, err := parseName(name, "snapshots"); err != nil {
		return nil, err
	}
	b := srv.b
	b.pruneSnapshotsLocked(b.nowNanos())
	sn := b.snaps[name]
	if sn == nil {
		return nil, status.Errorf(codes.NotFound, "snapshot not found: %s", name)
	}
	return sn, nil
}

func (srv *subscriberServer) CreateSnapshot(ctx context.Context, req *pb.CreateSnapshotRequest) (*pb.Snapshot, error) {
	b := srv.b
	return changeTo(ctx, b, func() (*pb.Snapshot, error) {
		s, err := srv.subscription(req.Subscription)
		if err != nil {
			return nil, err
		}
		name := req.Name
		if name == "" {
			// The service names it itself when the request does not.
			project, _, _ := parseName(req.Subscription, "subscriptions")
			name = "projects/" + project + "/snapshots/snapshot-" + strconv.FormatUint(b.nextID, 10)
		}
		sn, err := srv.createSnapshotLocked(s, name, req.Labels)
		if err != nil {
			return nil, err
		}
		return proto.Clone(sn.proto).(*pb.Snapshot), nil
	})
}

func (srv *subscriberServer) createSnapshotLocked(s *subscription, name string, labels map[string]string) (*snapshot, error) {
	if _, _, err := parseName(name, "snapshots"); err != nil {
		return nil, err
	}
	if err := checkLabels(labels); err != nil {
		return nil, err
	}
	b := srv.b
	now := b.nowNanos()
	b.pruneSnapshotsLocked(now)
	if b.snaps[name] != nil {
		return nil, status.Errorf(codes.AlreadyExists, "snapshot %s already exists", name)
	}
	if s.topic == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "subscription %s has no topic (deleted or detached)", s.proto.Name)
	}
	oldest := now
	cutoff := now - int64(s.retention())
	s.forEachHeld(func(m *message) {
		if m.publish >= cutoff {
			oldest = min(oldest, m.publish)
		}
	})
	expire := time.Unix(0, oldest).Add(snapshotLife)
	if left := expire.Sub(time.Unix(0, now)); left < minSnapshotLife {
		return nil, status.Errorf(codes.FailedPrecondition,
			"the snapshot would expire in %v: its oldest unacknowledged message is %v old, and a snapshot lives %v minus that, at least %v",
			left.Round(time.Second), time.Duration(now-oldest).Round(time.Second), snapshotLife, minSnapshotLife)
	}
	sp := &pb.Snapshot{Name: name, Topic: s.topic.proto.Name, ExpireTime: timestamppb.New(expire), Labels: labels}
	return b.newSnapshotLocked(b.nextID, s, now, sp), nil
}

func (srv *subscriberServer) GetSnapshot(_ context.Context, req *pb.GetSnapshotRequest) (*pb.Snapshot, error) {
	return get(srv.b, req.Snapshot, srv.snapshot, (*snapshot).resource)
}

func (srv *subscriberServer) ListSnapshots(_ context.Context, req *pb.ListSnapshotsRequest) (*pb.ListSnapshotsResponse, error) {
	b := srv.b
	snaps, next, err := list(b, req.Project, "snapshots", req.PageSize, req.PageToken, func() map[string]*snapshot {
		b.pruneSnapshotsLocked(b.nowNanos())
		return b.snaps
	}, (*snapshot).resource)
	if err != nil {
		return nil, err
	}
	return &pb.ListSnapshotsResponse{Snapshots: snaps, NextPageToken: next}, nil
}

// UpdateSnapshot changes labels and expire_time. The expiry can only come
// earlier: the snapshot keeps its messages only as long as it was promised.
func (srv *subscriberServer) UpdateSnapshot(ctx context.Context, req *pb.UpdateSnapshotRequest) (*pb.Snapshot, error) {
	b := srv.b
	return changeTo(ctx, b, func() (*pb.Snapshot, error) {
		sn, err := srv.snapshot(req.GetSnapshot().GetName())
		if err != nil {
			return nil, err
		}
		sp := proto.Clone(sn.proto).(*pb.Snapshot)
		if err := applyMask(sp, req.Snapshot, req.UpdateMask, "name", "topic"); err != nil {
			return nil, err
		}
		if err := checkLabels(sp.Labels); err != nil {
			return nil, err
		}
		now, was := time.Unix(0, b.nowNanos()), sn.proto.ExpireTime.AsTime()
		switch at := sp.ExpireTime.AsTime(); {
		case sp.ExpireTime == nil || !at.After(now):
			return nil, status.Errorf(codes.InvalidArgument, "expire_time must be in the future, not %v", at.UTC())
		case at.After(was):
			return nil, status.Errorf(codes.InvalidArgument, "expire_time %v is later than the snapshot's expiry %v, which cannot be extended", at.UTC(), was.UTC())
		}
		sn.proto = sp
		b.logRecord(recSnap, func(d []byte) []byte { return appendSnap(d, sn, 0, 0) })
		return proto.Clone(sp).(*pb.Snapshot), nil
	})
}

func (srv *subscriberServer) DeleteSnapshot(ctx context.Context, req *pb.DeleteSnapshotRequest) (*emptypb.Empty, error) {
	return remove(ctx, srv.b, req.Snapshot, srv.snapshot, srv.b.deleteSnapshotLocked)
}

// seekToSnapshotLocked is Seek with a snapshot target; b.mu must be held.
func (srv *subscriberServer) seekToSnapshotLocked(s *subscription, name string) error {
	sn, err := srv.snapshot(name)
	if err != nil {
		return err
	}
	if sn.topic == nil || sn.topic != s.topic {
		return status.Errorf(codes.FailedPrecondition, "snapshot %s is of topic %s, subscription %s of topic %s",
			name, sn.proto.Topic, s.proto.Name, s.proto.Topic)
	}
	srv.b.seekSnapshotLocked(s, sn)
	return nil
}

// topicSnapshotsLocked lists the names of t's snapshots, sorted.
func (b *Broker) topicSnapshotsLocked(t *topic) []string {
	b.pruneSnapshotsLocked(b.nowNanos())
	var names []string
	for _, sn := range t.snaps {
		names = append(names, sn.proto.Name)
	}
	slices.Sort(names)
	return names
}
