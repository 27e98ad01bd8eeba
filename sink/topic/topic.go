package topic

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink"
)

// A batch holds at most limits.RequestMessages messages and maxBatchBytes,
// the service's request bound with room for each message's framing and the
// request's own fields.
const (
	maxBatchBytes = 9 << 20
	maxRPCs       = 4
)

// ErrStopped is returned by Write after Stop.
var ErrStopped = errors.New("topic sink stopped")

// publishFunc is the one call the sink makes; tests may count it.
type publishFunc func(ctx context.Context, req *pb.PublishRequest, opts ...gax.CallOption) (*pb.PublishResponse, error)

// Sink publishes messages to a topic and returns once the server
// acknowledged the publish.
//
// It batches by itself, on the client's generated Publish call, rather
// than through pubsub.Publisher: the pipeline waits for every write, so it
// needs one request per batch and none of the Publisher's per-message
// machinery (a result channel, a scheduler goroutine, stats tags). Batches form the
// way group commits do: a lone write goes at once; while requests are in
// flight, writes gather, and another request starts only once the
// gathered batch is big enough to pay for it (busy/maxRPCs of a full one).
type Sink struct {
	topic   string
	publish publishFunc
	timeout time.Duration

	mu     sync.Mutex
	full   []*batch // closed for size, waiting for a free request
	open   *batch   // gathering
	busy   int      // requests in flight
	closed bool
	rpcs   sync.WaitGroup
}

var _ sink.BatchSink = (*Sink)(nil)

// batch is the messages of one publish request and, once done is closed,
// its outcome: err for all, or errs one by one after a rejected request
// was split.
type batch struct {
	msgs  []*pb.PubsubMessage // nil where the writer gave up before it was sent
	bytes int
	taken bool // handed to a request: msgs no longer change
	done  chan struct{}
	err   error
	errs  []error
}

func (b *batch) result(i int) error {
	if b.errs != nil {
		return b.errs[i]
	}
	return b.err
}

// New publishes to topic through c. A publish request gives up
// after timeout, so a write never outlives the claim lease that guards it.
func New(c *pubsub.Client, topic pubsubio.Name, timeout time.Duration) *Sink {
	return &Sink{topic: topic.String(), publish: c.TopicAdminClient.Publish, timeout: timeout}
}

// Write implements sink.Sink.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	pm, size := message(m)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("publish to %s: %w", s.topic, ErrStopped)
	}
	b := s.open
	if b != nil && (len(b.msgs) == limits.RequestMessages || b.bytes+size > maxBatchBytes) {
		s.full = append(s.full, b)
		b = nil
	}
	if b == nil {
		b = &batch{done: make(chan struct{})}
		s.open = b
	}
	i := len(b.msgs)
	b.msgs = append(b.msgs, pm)
	b.bytes += size
	next := s.takeLocked(false)
	s.mu.Unlock()
	if next != nil {
		go s.run(next)
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		// Not sent yet: take it out, so the message the caller will retry
		// (its key released, the input nacked) is not published later too.
		s.mu.Lock()
		if !b.taken {
			b.msgs[i] = nil
		}
		s.mu.Unlock()
		return fmt.Errorf("publish to %s: %w", s.topic, context.Cause(ctx))
	}
	return s.failed(b.result(i))
}

// message is m as published, and its size as the request limit counts it.
func message(m *sink.Message) (*pb.PubsubMessage, int) {
	size := len(m.Data)
	for k, v := range m.Attributes {
		size += len(k) + len(v)
	}
	return &pb.PubsubMessage{Data: m.Data, Attributes: m.Attributes}, size
}

// failed is the error a writer gets for a publish that failed with err.
func (s *Sink) failed(err error) error {
	if err == nil {
		return nil
	}
	if status.Code(err) == codes.InvalidArgument {
		return fmt.Errorf("publish to %s: %w: %w", s.topic, sink.ErrPermanent, err)
	}
	return fmt.Errorf("publish to %s: %w", s.topic, err)
}

// WriteBatch implements sink.BatchSink: the messages go out in one publish
// request (more when they pass 1,000 messages or 9 MB), sent by the caller
// itself rather than gathered with other writers' messages, bounded by the
// sink's timeout as its own requests are.
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		for i := range errs {
			errs[i] = fmt.Errorf("publish to %s: %w", s.topic, ErrStopped)
		}
		return
	}
	s.rpcs.Add(1) // Stop waits for this batch's requests as for its own
	s.mu.Unlock()
	defer s.rpcs.Done()
	msgs := make([]*pb.PubsubMessage, len(ms))
	from, bytes := 0, 0
	flush := func(to int) {
		each, err := s.request(ctx, msgs[from:to])
		for i := from; i < to; i++ {
			if each != nil {
				err = each[i-from]
			}
			errs[i] = s.failed(err)
		}
		from, bytes = to, 0
	}
	for i, m := range ms {
		pm, size := message(m)
		if i > from && (i-from == limits.RequestMessages || bytes+size > maxBatchBytes) {
			flush(i)
		}
		msgs[i] = pm
		bytes += size
	}
	if from < len(ms) {
		flush(len(ms))
	}
}

// takeLocked hands out the next batch to send, counting it as in flight
// (and in rpcs, under the lock, so Stop cannot miss it), or nil when
// nothing should start now. all sends what is gathered
// regardless of its size (on Stop).
func (s *Sink) takeLocked(all bool) *batch {
	if s.busy >= maxRPCs && !all {
		return nil
	}
	var b *batch
	switch {
	case len(s.full) > 0:
		b, s.full = s.full[0], s.full[1:]
	case s.open != nil && (all || len(s.open.msgs) >= s.busy*limits.RequestMessages/maxRPCs):
		b, s.open = s.open, nil
	default:
		return nil
	}
	s.busy++
	s.rpcs.Add(1)
	b.taken = true
	return b
}

// run sends b, then whatever became due meanwhile, so a request in flight
// is followed at once by the writes that gathered behind it.
func (s *Sink) run(b *batch) {
	for b != nil {
		s.send(b)
		s.mu.Lock()
		s.busy--
		next := s.takeLocked(s.closed)
		s.mu.Unlock()
		s.rpcs.Done() // after next was counted: rpcs never touches zero between them
		b = next
	}
}

// send publishes b and records the outcome.
func (s *Sink) send(b *batch) {
	defer close(b.done)
	b.errs, b.err = s.request(context.Background(), b.msgs)
}

// request publishes msgs (leaving out nil ones: writers that gave up) in
// one request within the sink's timeout, and returns the outcome: each
// message's in errs, or err for all when errs is nil. A request the server refuses as invalid
// is split, so one bad message (too large, say) fails alone and the others
// go through: one at a time, within a second timeout for the whole split,
// so a refused request costs its writers at most twice the bound of one.
func (s *Sink) request(parent context.Context, msgs []*pb.PubsubMessage) (errs []error, err error) {
	live := make([]*pb.PubsubMessage, 0, len(msgs))
	for _, m := range msgs {
		if m != nil {
			live = append(live, m)
		}
	}
	if len(live) == 0 {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(parent, s.timeout)
	defer cancel()
	err = s.call(ctx, live)
	if status.Code(err) != codes.InvalidArgument || len(live) == 1 {
		return nil, err
	}
	ctx, cancel = context.WithTimeout(parent, s.timeout)
	defer cancel()
	errs = make([]error, len(msgs))
	for i, m := range msgs {
		if m != nil {
			errs[i] = s.call(ctx, []*pb.PubsubMessage{m})
		}
	}
	return errs, nil
}

func (s *Sink) call(ctx context.Context, msgs []*pb.PubsubMessage) error {
	_, err := s.publish(ctx, &pb.PublishRequest{Topic: s.topic, Messages: msgs})
	return err
}

// Stop sends what is gathered, waits for every request in flight and
// refuses later writes.
func (s *Sink) Stop() {
	s.mu.Lock()
	s.closed = true
	var next []*batch
	for {
		b := s.takeLocked(true)
		if b == nil {
			break
		}
		next = append(next, b)
	}
	s.mu.Unlock()
	for _, b := range next {
		go s.run(b)
	}
	s.rpcs.Wait()
}
