package broker

import (
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/udf"
	"github.com/dedupflow/dedupflow/broker/internal/wire"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// transform is one of a topic's or subscription's message_transforms, with
// the counts the /broker page and /metrics show.
type transform struct {
	fn       *udf.Func // nil when disabled
	name     string
	disabled bool
	filtered atomic.Int64
	failed   atomic.Int64
}

// transforms is a resource's compiled message_transforms, in order; nil when
// it has none, so that the publish and delivery paths pay one nil check.
type transforms struct {
	list []*transform
	src  []*pb.MessageTransform
}

// maxEnabledTransforms is how many transforms a topic or a subscription may
// have enabled: "up to five", in Google's guides to creating them.
const maxEnabledTransforms = 5

// compileTransforms checks message_transforms as CreateTopic, UpdateTopic,
// CreateSubscription and UpdateSubscription do: each must be a JavaScript
// UDF whose code parses and holds the named function.
func compileTransforms(ms []*pb.MessageTransform) (*transforms, error) {
	if len(ms) == 0 {
		return nil, nil
	}
	enabled := 0
	for _, m := range ms {
		if !m.Disabled {
			enabled++
		}
	}
	if enabled > maxEnabledTransforms {
		return nil, status.Errorf(codes.InvalidArgument, "message_transforms: %d are enabled, at most %d may be", enabled, maxEnabledTransforms)
	}
	ts := &transforms{src: ms}
	for i, m := range ms {
		js := m.GetJavascriptUdf()
		if js == nil {
			return nil, status.Errorf(codes.InvalidArgument, "message_transforms[%d]: only javascript_udf transforms are supported by this broker", i)
		}
		t := &transform{name: js.FunctionName, disabled: m.Disabled}
		fn, err := udf.Compile(js.FunctionName, js.Code)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "message_transforms[%d].javascript_udf: %v", i, err)
		}
		if !m.Disabled {
			t.fn = fn
		}
		ts.list = append(ts.list, t)
	}
	return ts, nil
}

// checkTransforms is compileTransforms for the config checks.
func checkTransforms(ms []*pb.MessageTransform) error {
	_, err := compileTransforms(ms)
	return err
}

// updated returns the compiled transforms for ms, keeping ts (and its
// counts) when ms did not change. ms was checked before it was stored.
func (ts *transforms) updated(ms []*pb.MessageTransform) *transforms {
	if ts != nil && len(ts.src) == len(ms) {
		same := true
		for i := range ms {
			same = same && proto.Equal(ts.src[i], ms[i])
		}
		if same {
			return ts
		}
	}
	out, err := compileTransforms(ms)
	if err != nil {
		// Stored by an older broker that did not check: kept, and shown
		// failing every message rather than silently skipped.
		out = &transforms{src: ms, list: []*transform{{name: fmt.Sprintf("invalid: %v", status.Convert(err).Message())}}}
	}
	return out
}

// transformCode is the status of a publish that a topic's transform failed:
// DEADLINE_EXCEEDED, which clients retry, when it ran out of time (on a
// loaded machine a quick function can, so it is worth another try), and
// INVALID_ARGUMENT when it threw or returned no message, which a retry
// would only repeat.
func transformCode(err error) codes.Code {
	if errors.Is(err, udf.ErrTimeout) {
		return codes.DeadlineExceeded
	}
	return codes.InvalidArgument
}

// errTransform is the failure of a message in one transform.
type errTransform struct {
	name string
	err  error
}

func (e *errTransform) Error() string {
	return fmt.Sprintf("message transform %s failed: %v", e.name, e.err)
}

func (e *errTransform) Unwrap() error { return e.err }

// apply runs the enabled transforms in order on m. It returns nil when one
// of them filtered the message out.
func (ts *transforms) apply(m *pb.PubsubMessage) (*pb.PubsubMessage, error) {
	md := udf.Metadata{MessageID: m.MessageId, OrderingKey: m.OrderingKey}
	if m.PublishTime != nil {
		md.PublishTime = m.PublishTime.AsTime()
	}
	in := udf.Message{Data: m.Data, Attributes: m.Attributes}
	changed := false
	for _, t := range ts.list {
		if t.disabled {
			continue
		}
		if t.fn == nil {
			t.failed.Add(1)
			return nil, &errTransform{t.name, fmt.Errorf("not compiled")}
		}
		out, keep, err := t.fn.Apply(in, md)
		if err != nil {
			t.failed.Add(1)
			return nil, &errTransform{t.name, err}
		}
		if !keep {
			t.filtered.Add(1)
			return nil, nil
		}
		in, changed = out, true
	}
	if !changed {
		return m, nil
	}
	return &pb.PubsubMessage{Data: in.Data, Attributes: in.Attributes, MessageId: m.MessageId,
		PublishTime: m.PublishTime, OrderingKey: m.OrderingKey}, nil
}

// topicTransforms returns the topic's transforms, nil for a topic with none
// or a missing topic (Publish reports that).
func (b *Broker) topicTransforms(name string) *transforms {
	if !b.anyTopicTransforms.Load() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := b.topics[name]; t != nil {
		return t.transforms
	}
	return nil
}

// transformPublish runs the topic's transforms on the messages of a
// publish, outside the broker's lock, and returns the messages to store with
// their sizes (nil for a message filtered out: its publisher gets a message
// ID and nothing is stored) and the request that schema validation sees.
// A message that fails a topic transform fails the whole publish, with
// nothing stored. A topic without transforms costs an atomic load, or a
// lookup once some topic has transforms. The UDF's
// metadata has the publish time but no message_id: IDs are given after the
// transforms, since a filtered message takes none from the log.
func (b *Broker) transformPublish(req *pb.PublishRequest, sizes []int) (*pb.PublishRequest, []*pb.PubsubMessage, []int, error) {
	ts := b.topicTransforms(req.Topic)
	if ts == nil {
		return req, req.Messages, sizes, nil
	}
	now := timestamppb.New(time.Unix(0, b.nowNanos()))
	out := make([]*pb.PubsubMessage, len(req.Messages))
	kept := &pb.PublishRequest{Topic: req.Topic}
	newSizes := make([]int, len(req.Messages))
	for i, m := range req.Messages {
		r, err := ts.apply(&pb.PubsubMessage{Data: m.Data, Attributes: m.Attributes, OrderingKey: m.OrderingKey, PublishTime: now})
		if err != nil {
			return nil, nil, nil, status.Errorf(transformCode(err), "messages[%d]: %v", i, err)
		}
		if r == nil {
			continue
		}
		r = &pb.PubsubMessage{Data: r.Data, Attributes: r.Attributes, OrderingKey: m.OrderingKey}
		if newSizes[i], err = checkMessage(i, r); err != nil {
			return nil, nil, nil, status.Errorf(codes.InvalidArgument, "after message transforms: %v", status.Convert(err).Message())
		}
		out[i] = r
		kept.Messages = append(kept.Messages, r)
	}
	return kept, out, newSizes, nil
}

// filteredIDLocked spends a sequence number on a filtered message, so that
// its ID is not given to another message. The counters go into the log,
// as compaction saves them, so a restart does not give it out again.
func (b *Broker) filteredIDLocked() string {
	id := strconv.FormatUint(b.nextSeq, 10)
	b.nextSeq++
	b.logRecord(recCounters, b.appendCounters)
	return id
}

// transformDeliveries runs a subscription's transforms on deliveries leased
// from it, outside the broker's lock, and returns those to hand out.
func (b *Broker) transformDeliveries(s *subscription, ts *transforms, ds []delivery) []delivery {
	out := ds[:0]
	for _, d := range ds {
		if b.transformDelivery(s, ts, &d, false) == transformDeliver {
			out = append(out, d)
		}
	}
	clear(ds[len(out):])
	return out
}

// transformResult is what a subscription's transforms made of a delivery.
type transformResult int8

const (
	transformDeliver transformResult = iota
	transformFiltered
	transformFailed
)

// transformDelivery runs s's transforms on d, replacing its message by the
// result, and reports whether d is to be delivered. A message filtered out
// is acknowledged, as the subscription will never deliver it. A message
// that fails goes to the dead-letter topic when the subscription has one;
// otherwise it is not delivered and its lease runs out (push nacks it,
// leaving it to the push backoff), so that it is tried again later, like a
// message its subscriber did not acknowledge, and counts a delivery attempt.
func (b *Broker) transformDelivery(s *subscription, ts *transforms, d *delivery, push bool) transformResult {
	m := d.m.proto()
	r, err := ts.apply(m)
	if err == nil && r != nil {
		if r != m {
			body := wire.Body(r.Data, r.Attributes)
			size := len(r.Data)
			for k, v := range r.Attributes {
				size += len(k) + len(v)
			}
			d.m = &message{seq: d.m.seq, topic: d.m.topic, publish: d.m.publish, body: body, key: d.m.key, size: size}
		}
		return transformDeliver
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	l := s.leases[d.ackID]
	if err == nil {
		if l != nil && !l.backoff {
			b.ackLeaseLocked(l)
		}
		return transformFiltered
	}
	if l == nil || l.backoff {
		return transformFailed
	}
	b.log.Warn("message failed a subscription's transform; not delivered", "subscription", s.proto.Name,
		"message_id", d.m.id(), "err", err)
	if s.proto.DeadLetterPolicy != nil && !errors.Is(err, udf.ErrTimeout) {
		b.endLeaseLocked(l)
		if b.deadLetterLocked(s, l.it, b.nowNanos()) {
			return transformFailed
		}
		s.leases[l.id] = l
		b.timers.push(l)
	}
	if push {
		b.nackLocked(l, b.nowNanos())
	}
	return transformFailed
}

// TransformStats describes one of a resource's message transforms.
type TransformStats struct {
	Function string // the JavaScript UDF's function_name
	Disabled bool
	// Filtered and Failed count the messages it returned null for and
	// those it failed, since the broker started or the transform changed.
	Filtered, Failed int64
}

func (ts *transforms) stats() []TransformStats {
	if ts == nil {
		return nil
	}
	out := make([]TransformStats, len(ts.list))
	for i, t := range ts.list {
		out[i] = TransformStats{Function: t.name, Disabled: t.disabled, Filtered: t.filtered.Load(), Failed: t.failed.Load()}
	}
	return out
}
