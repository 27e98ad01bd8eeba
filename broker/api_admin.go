package broker

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/filter"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// State changes of topics and subscriptions, shared by the RPC handlers and
// log replay. All run with b.mu held.

// putTopicLocked creates the topic with internal id, or replaces its
// configuration.
func (b *Broker) putTopicLocked(id uint64, tp *pb.Topic) *topic {
	t := b.topicByID[id]
	if t == nil {
		t = &topic{id: id, subs: map[uint64]*subscription{}}
		b.topicByID[id] = t
	}
	t.proto = tp
	if t.transforms = t.transforms.updated(tp.MessageTransforms); t.transforms != nil {
		b.anyTopicTransforms.Store(true)
	}
	b.topics[tp.Name] = t
	b.nextID = max(b.nextID, id+1)
	t.updateRetainFor()
	b.logTopic(t)
	for _, s := range t.subs {
		s.proto.TopicMessageRetentionDuration = tp.MessageRetentionDuration
	}
	return t
}

// deleteTopicLocked removes the topic. Its subscriptions live on, detached,
// with the topic shown as "_deleted-topic_", as in the service.
func (b *Broker) deleteTopicLocked(t *topic) {
	b.logDelete(recTopicDel, t.id)
	b.dropPolicyLocked(t.proto.Name)
	for _, s := range t.subs {
		s.topic = nil
		s.proto.Topic = deletedTopic
		s.proto.TopicMessageRetentionDuration = nil
	}
	detachSnapshotsLocked(t)
	delete(b.topics, t.proto.Name)
	delete(b.topicByID, t.id)
}

func (b *Broker) putSubLocked(id uint64, t *topic, firstSeq uint64, sp *pb.Subscription) *subscription {
	s := b.subByID[id]
	if s == nil {
		s = &subscription{id: id, firstSeq: firstSeq, keys: map[string]*keyState{},
			leases: map[uint64]*lease{}, waiters: map[chan struct{}]struct{}{}}
		if b.replaying {
			s.replay = &replaySet{}
		}
		b.subByID[id] = s
	}
	if s.topic != nil && s.topic != t {
		delete(s.topic.subs, s.id)
		s.topic.updateRetainFor()
	}
	if s.proto.GetFilter() != sp.Filter {
		// checkSubscriptionConfig already parsed it, so this cannot fail.
		s.filter, _ = filter.Parse(sp.Filter)
	}
	s.proto, s.topic = sp, t
	s.transforms = s.transforms.updated(sp.MessageTransforms)
	if t != nil {
		// Output only: the service shows the topic's retention on each
		// of its subscriptions.
		sp.TopicMessageRetentionDuration = t.proto.MessageRetentionDuration
		t.subs[id] = s
		t.updateRetainFor()
	}
	b.subs[sp.Name] = s
	b.nextID = max(b.nextID, id+1)
	b.logSub(s)
	s.notify() // streams and the pusher pick up changed settings
	b.startPusherLocked(s)
	b.startExporterLocked(s)
	return s
}

func (b *Broker) deleteSubLocked(s *subscription) {
	b.logDelete(recSubDel, s.id)
	b.dropPolicyLocked(s.proto.Name)
	b.resetSubLocked(s)
	if s.topic != nil {
		delete(s.topic.subs, s.id)
		s.topic.updateRetainFor()
	}
	delete(b.subs, s.proto.Name)
	delete(b.subByID, s.id)
	delete(b.exportStats, s.proto.Name)
	s.topic = nil
	s.proto = proto.Clone(s.proto).(*pb.Subscription)
	s.proto.Name = "" // marks it deleted for streams still attached
	s.notify()
}

func (s *subscription) deleted() bool { return s.proto.Name == "" }

// page returns the names after token, up to size, and the next token.
func page(names []string, size int32, token string) ([]string, string, error) {
	start := 0
	if token != "" {
		n, err := strconv.Atoi(token)
		if err != nil || n < 0 || n > len(names) {
			return nil, "", status.Errorf(codes.InvalidArgument, "invalid page_token %q", token)
		}
		start = n
	}
	if size <= 0 || size > 1000 {
		size = 1000
	}
	end := min(start+int(size), len(names))
	next := ""
	if end < len(names) {
		next = strconv.Itoa(end)
	}
	return names[start:end], next, nil
}

// listPage returns a page of the resources of kind in project, copies of
// what msg returns, and the next page token.
func listPage[T any, P proto.Message](m map[string]T, project, kind string, size int32, token string, msg func(T) P) ([]P, string, error) {
	names, next, err := page(namesIn(m, project, kind), size, token)
	if err != nil {
		return nil, "", err
	}
	out := make([]P, 0, len(names))
	for _, n := range names {
		out = append(out, proto.Clone(msg(m[n])).(P))
	}
	return out, next, nil
}

// get finds the resource name with find under b.mu and answers a copy of
// what msg returns: the shape of every Get call.
func get[T any, P proto.Message](b *Broker, name string, find func(string) (T, error), msg func(T) P) (P, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	r, err := find(name)
	if err != nil {
		var none P
		return none, err
	}
	return proto.Clone(msg(r)).(P), nil
}

// list is listPage for a List call on parent (projects/P): the map of the
// resources is read under b.mu.
func list[T any, P proto.Message](b *Broker, parent, kind string, size int32, token string, all func() map[string]T, msg func(T) P) ([]P, string, error) {
	project, err := projectOf(parent)
	if err != nil {
		return nil, "", err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return listPage(all(), project, kind, size, token, msg)
}

func namesIn[T any](m map[string]T, project, kind string) []string {
	prefix := "projects/" + project + "/" + kind + "/"
	var out []string
	for _, n := range slices.Sorted(maps.Keys(m)) {
		if strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out
}

func projectOf(name string) (string, error) {
	p, ok := strings.CutPrefix(name, "projects/")
	if !ok || p == "" || strings.Contains(p, "/") {
		return "", status.Errorf(codes.InvalidArgument, "invalid project %q: want projects/{project}", name)
	}
	if err := limits.Project(p); err != nil {
		return "", status.Errorf(codes.InvalidArgument, "invalid project %q: %v", name, err)
	}
	return p, nil
}
