package pull

import (
	"context"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/backoff"
)

// maxIDs is the most ack IDs in one request: well inside the 10 MB a
// request may carry, as the official client's bound.
const maxIDs = 2500

// drainTimeout bounds how long a stop reads a half-closed stream to its end.
const drainTimeout = 5 * time.Second

// unaryTimeout bounds an ack or nack sent by a unary call after its stream
// broke: what it fails to settle comes back after its ack deadline.
const unaryTimeout = 10 * time.Second

// weight is what a message holds of the in-process flow control.
type weight struct{ msgs, bytes int64 }

// session is one stream's life.
type session struct {
	r       *Receiver
	spc     pb.Subscriber_StreamingPullClient
	h       Handler
	held    map[string]weight // every message in hand, by ack ID
	pending []*pb.ReceivedMessage
	first   time.Time            // when pending's first message came
	retry   map[string]*ackRetry // acks the server failed for now, by ack ID
	resend  *time.Timer          // fires when the earliest retry is due
	working bool
	results chan settled
	got     bool
}

// ackRetry is an ack the server failed for now: how often, and when it is
// sent again (zero while it is out, awaiting its confirmation).
type ackRetry struct {
	fails int
	due   time.Time
}

// settled is a handled batch and what to do with each of its messages.
type settled struct {
	ms []*pb.ReceivedMessage
	rs []Result
}

// session runs one stream until it breaks, and returns the error, or until
// ctx ends, and then settles what it holds and returns nil. got says it
// received messages.
func (r *Receiver) session(ctx context.Context, h Handler) (got bool, err error) {
	// The stream outlives ctx for as long as the stop takes: the batch in
	// hand is acked down it.
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	// Until the stream is open, ctx's end ends the attempt too: the client
	// retries the opening for as long as its context lives, for ever while
	// the server is down.
	opening := context.AfterFunc(ctx, cancel)
	spc, err := r.sac.StreamingPull(sctx)
	if !opening() {
		return false, context.Cause(ctx) // nothing is in hand yet
	}
	if err != nil {
		return false, err
	}
	r.streams.Add(1)
	n := int64(r.opt.Streams)
	err = spc.Send(&pb.StreamingPullRequest{
		Subscription:             r.sub,
		ClientId:                 r.clientID,
		StreamAckDeadlineSeconds: int32(r.opt.AckDeadline / time.Second),
		MaxOutstandingMessages:   max(1, int64(r.opt.MaxOutstanding)/n),
		MaxOutstandingBytes:      max(1, r.opt.MaxOutstandingBytes/n),
		ProtocolVersion:          1,
	})
	if err != nil {
		_, err = spc.Recv() // Send reports io.EOF; the stream's error comes from Recv
		return false, err
	}
	s := &session{r: r, spc: spc, h: h, held: map[string]weight{}, retry: map[string]*ackRetry{},
		resend: time.NewTimer(time.Hour), results: make(chan settled, 1)}
	s.resend.Stop()
	defer s.resend.Stop()
	resps, recvErr, recvDone := s.receive(sctx)
	defer func() {
		cancel()
		<-recvDone
	}()
	err = s.run(ctx, resps, recvErr)
	return s.got, err
}

// incoming is a response and the flow control its messages took.
type incoming struct {
	resp *pb.StreamingPullResponse
	ws   []weight
}

// receive reads the stream on a goroutine of its own: each response waits
// for room in the in-process flow control before it is passed on.
func (s *session) receive(ctx context.Context) (<-chan incoming, <-chan error, <-chan struct{}) {
	resps, errc, done := make(chan incoming), make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		for {
			resp, err := s.spc.Recv()
			if err != nil {
				errc <- err
				return
			}
			in := incoming{resp: resp, ws: s.r.weigh(resp.ReceivedMessages)}
			if err := s.r.acquire(ctx, in.ws); err != nil {
				return // stopping
			}
			select {
			case resps <- in:
			case <-ctx.Done():
				s.r.release(in.ws...)
				return
			}
		}
	}()
	return resps, errc, done
}

// weigh gives each message its share of the flow control: one message and
// its size, except that a response larger than the bounds takes all of
// them and no more, or it could never be let in.
func (r *Receiver) weigh(ms []*pb.ReceivedMessage) []weight {
	ws := make([]weight, len(ms))
	leftMsgs, leftBytes := int64(r.opt.MaxOutstanding), r.opt.MaxOutstandingBytes
	for i, m := range ms {
		if leftMsgs > 0 {
			ws[i].msgs, leftMsgs = 1, leftMsgs-1
		}
		b := min(int64(len(m.GetMessage().GetData())), leftBytes)
		ws[i].bytes, leftBytes = b, leftBytes-b
	}
	return ws
}

func (r *Receiver) acquire(ctx context.Context, ws []weight) error {
	var m, b int64
	for _, w := range ws {
		m, b = m+w.msgs, b+w.bytes
	}
	if err := r.msgs.Acquire(ctx, m); err != nil {
		return err
	}
	if err := r.bytes.Acquire(ctx, b); err != nil {
		r.msgs.Release(m)
		return err
	}
	return nil
}

func (r *Receiver) release(ws ...weight) {
	var m, b int64
	for _, w := range ws {
		m, b = m+w.msgs, b+w.bytes
	}
	r.msgs.Release(m)
	r.bytes.Release(b)
}

func (s *session) run(ctx context.Context, resps <-chan incoming, recvErr <-chan error) error {
	opt := &s.r.opt
	fill := time.NewTimer(opt.BatchWait)
	fill.Stop()
	defer fill.Stop()
	lease := time.NewTicker(opt.AckDeadline / 2)
	defer lease.Stop()
	ping := time.NewTicker(opt.pingEvery)
	defer ping.Stop()
	check := time.NewTimer(opt.serverTimeout)
	check.Stop()
	defer check.Stop()
	var lastPing, lastResp time.Time
	checking := false
	// answers: the server has answered a ping on this stream. Only then is
	// its silence taken for a dead stream: a server before protocol_version
	// 1 (Google's emulator 528) never answers, and a stream reopened to that
	// emulator strands the next messages on the old one (measured: none
	// arrived in 30 s; TestKeepalive keeps a stream to it open).
	answers := false
	for {
		if !s.working && len(s.pending) > 0 && (len(s.pending) >= opt.MaxBatch || time.Since(s.first) >= opt.BatchWait) {
			s.dispatch(ctx)
		}
		select {
		case in := <-resps:
			lastResp = time.Now()
			if len(in.resp.ReceivedMessages) == 0 && in.resp.AcknowledgeConfirmation == nil && in.resp.ModifyAckDeadlineConfirmation == nil {
				answers = true // an empty response: the server answers pings
			}
			s.confirmed(in.resp)
			if len(s.pending) == 0 && len(in.resp.ReceivedMessages) > 0 {
				s.first = lastResp
				fill.Reset(opt.BatchWait)
			}
			for i, m := range in.resp.ReceivedMessages {
				s.held[m.AckId] = in.ws[i]
				s.pending = append(s.pending, m)
			}
			if n := len(in.resp.ReceivedMessages); n > 0 {
				s.got = true
				s.r.received.Add(int64(n))
			}
		case err := <-recvErr:
			return s.broken(err)
		case d := <-s.results:
			s.working = false
			if err := s.settle(d, false); err != nil {
				return s.broken(err)
			}
			if len(s.pending) > 0 {
				fill.Reset(max(opt.BatchWait-time.Since(s.first), 0))
			}
		case <-fill.C:
		case <-lease.C:
			if err := s.extend(); err != nil {
				return s.broken(err)
			}
		case <-s.resend.C:
			if err := s.resendDue(); err != nil {
				return s.broken(err)
			}
		case <-ping.C:
			if err := s.spc.Send(&pb.StreamingPullRequest{}); err != nil {
				return s.broken(err)
			}
			if lastPing.IsZero() || lastResp.After(lastPing) {
				lastPing = time.Now() // the oldest ping still unanswered
			}
			if !checking { // a check already due is not put off by the next ping
				checking = true
				check.Reset(opt.serverTimeout)
			}
		case <-check.C:
			checking = false
			if answers && lastResp.Before(lastPing) && time.Since(lastPing) >= opt.serverTimeout {
				return s.broken(errSilent)
			}
		case <-ctx.Done():
			return s.stop(resps, recvErr)
		}
	}
}

// dispatch hands up to MaxBatch pending messages to the handler, on a
// goroutine the session waits for before it returns.
func (s *session) dispatch(ctx context.Context) {
	n := min(len(s.pending), s.r.opt.MaxBatch)
	batch := append([]*pb.ReceivedMessage(nil), s.pending[:n]...)
	s.pending = append(s.pending[:0], s.pending[n:]...)
	if len(s.pending) > 0 {
		s.first = time.Now() // the rest waited for a batch in work, not to fill
	}
	s.working = true
	go func() {
		ms := make([]*pubsub.Message, len(batch))
		for i, rm := range batch {
			ms[i] = message(rm)
		}
		rs := make([]Result, len(batch))
		s.h(ctx, ms, rs)
		s.results <- settled{ms: batch, rs: rs}
	}()
}

func message(rm *pb.ReceivedMessage) *pubsub.Message {
	pm := rm.GetMessage()
	m := &pubsub.Message{ID: pm.GetMessageId(), Data: pm.GetData(), Attributes: pm.GetAttributes(),
		PublishTime: pm.GetPublishTime().AsTime(), OrderingKey: pm.GetOrderingKey()}
	if rm.DeliveryAttempt > 0 {
		n := int(rm.DeliveryAttempt)
		m.DeliveryAttempt = &n
	}
	return m
}

// settle acks and nacks a handled batch: down the stream, or by the unary
// calls when the stream is gone. Either way the messages leave the hand.
func (s *session) settle(d settled, unary bool) error {
	var acks []string
	nacks := map[int32][]string{} // by the deadline they get
	for i, m := range d.ms {
		if d.rs[i].Ack {
			acks = append(acks, m.AckId)
		} else {
			secs := int32((d.rs[i].NackAfter + time.Second - 1) / time.Second)
			nacks[secs] = append(nacks[secs], m.AckId)
		}
		s.r.release(s.held[m.AckId])
		delete(s.held, m.AckId)
	}
	s.r.acked.Add(int64(len(acks)))
	for _, ids := range nacks {
		s.r.nacked.Add(int64(len(ids)))
	}
	if err := s.ack(acks, unary); err != nil {
		return err
	}
	for secs, ids := range nacks {
		if err := s.modack(ids, secs, unary); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) ack(ids []string, unary bool) error {
	for len(ids) > 0 {
		n := min(len(ids), maxIDs)
		var err error
		if unary {
			ctx, cancel := context.WithTimeout(context.Background(), unaryTimeout)
			err = s.r.sac.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: s.r.sub, AckIds: ids[:n]})
			cancel()
		} else {
			err = s.spc.Send(&pb.StreamingPullRequest{AckIds: ids[:n]})
		}
		if err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

func (s *session) modack(ids []string, secs int32, unary bool) error {
	for len(ids) > 0 {
		n := min(len(ids), maxIDs)
		var err error
		if unary {
			ctx, cancel := context.WithTimeout(context.Background(), unaryTimeout)
			err = s.r.sac.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{
				Subscription: s.r.sub, AckIds: ids[:n], AckDeadlineSeconds: secs})
			cancel()
		} else {
			secsN := make([]int32, n)
			for i := range secsN {
				secsN[i] = secs
			}
			err = s.spc.Send(&pb.StreamingPullRequest{ModifyDeadlineAckIds: ids[:n], ModifyDeadlineSeconds: secsN})
		}
		if err != nil {
			return err
		}
		ids = ids[n:]
	}
	return nil
}

// extend moves the ack deadline of every message in hand on by the
// stream's ack deadline.
func (s *session) extend() error {
	ids := make([]string, 0, len(s.held))
	for id := range s.held {
		ids = append(ids, id)
	}
	return s.modack(ids, int32(s.r.opt.AckDeadline/time.Second), false)
}

// An ack the server failed for now is sent again on its own, after a pause
// that doubles from ackRetryMin with each failure of it, and at most
// maxAckRetries times: after that the message comes back, and is caught as
// a redelivery. The pauses add up to about 3 s, well inside the shortest
// ack deadline (10 s).
const (
	maxAckRetries = 5
	ackRetryMin   = 100 * time.Millisecond
	ackRetryMax   = 2 * time.Second
)

// resendDue acks again the retries that are due, and sets the timer for
// the next.
func (s *session) resendDue() error {
	now := time.Now()
	var ids []string
	for id, a := range s.retry {
		if !a.due.IsZero() && !a.due.After(now) {
			ids = append(ids, id)
			a.due = time.Time{}
		}
	}
	s.schedule()
	return s.ack(ids, false)
}

// schedule sets the resend timer for the earliest retry due.
func (s *session) schedule() {
	var next time.Time
	for _, a := range s.retry {
		if !a.due.IsZero() && (next.IsZero() || a.due.Before(next)) {
			next = a.due
		}
	}
	s.resend.Stop()
	if !next.IsZero() {
		s.resend.Reset(time.Until(next))
	}
}

// retryIDs are the acks still to retry, sent once more at a stop or after
// the stream broke.
func (s *session) retryIDs() []string {
	ids := make([]string, 0, len(s.retry))
	for id := range s.retry {
		ids = append(ids, id)
	}
	clear(s.retry)
	return ids
}

// confirmed reads an exactly-once subscription's ack confirmations.
func (s *session) confirmed(resp *pb.StreamingPullResponse) {
	c := resp.GetAcknowledgeConfirmation()
	if c == nil {
		return
	}
	for _, id := range c.AckIds {
		delete(s.retry, id)
	}
	for _, id := range c.InvalidAckIds {
		delete(s.retry, id)
	}
	s.r.invalid.Add(int64(len(c.InvalidAckIds)))
	if len(c.TemporaryFailedAckIds) == 0 {
		return
	}
	now := time.Now()
	for _, id := range c.TemporaryFailedAckIds {
		a := s.retry[id]
		if a == nil {
			a = &ackRetry{}
			s.retry[id] = a
		}
		if a.fails++; a.fails > maxAckRetries {
			delete(s.retry, id)
			continue
		}
		a.due = now.Add(backoff.Delay(a.fails, ackRetryMin, ackRetryMax))
	}
	s.schedule()
}

// stop settles what the session holds at a stop: the messages not handed
// over are nacked, the batch in work is finished and settled. Then it
// half-closes the stream and reads it to its end: what the server sent
// before it saw the half-close is nacked too (by the unary call), so it
// comes back at once rather than after the ack deadline.
func (s *session) stop(resps <-chan incoming, recvErr <-chan error) error {
	nack := settled{ms: s.pending, rs: make([]Result, len(s.pending))}
	s.pending = nil
	err := s.settle(nack, false)
	if e := s.ack(s.retryIDs(), false); err == nil {
		err = e
	}
	if s.working {
		d := <-s.results
		s.working = false
		if e := s.settle(d, err != nil); err == nil {
			err = e
		}
	}
	_ = s.spc.CloseSend()
	var late []string
	timeout := time.NewTimer(drainTimeout)
	defer timeout.Stop()
drain:
	for {
		select {
		case in := <-resps:
			for _, m := range in.resp.ReceivedMessages {
				late = append(late, m.AckId)
			}
			s.r.release(in.ws...)
		case <-recvErr:
			break drain
		case <-timeout.C:
			break drain
		}
	}
	if len(late) > 0 {
		s.r.received.Add(int64(len(late)))
		s.r.nacked.Add(int64(len(late)))
		if e := s.modack(late, 0, true); err == nil {
			err = e
		}
	}
	s.drop()
	if err != nil {
		s.r.opt.Logger.Warn("settling the messages in hand at the stop failed; they come back after their ack deadline",
			"subscription", s.r.sub, "err", err)
	}
	return nil
}

// broken settles what the session holds on a stream that broke with err,
// by the unary calls, and returns err.
func (s *session) broken(err error) error {
	if s.working {
		d := <-s.results
		s.working = false
		if e := s.settle(d, true); e != nil {
			s.r.opt.Logger.Warn("settling a batch after the stream broke failed; its messages come back",
				"subscription", s.r.sub, "err", e)
		}
	}
	if len(s.pending) > 0 {
		_ = s.settle(settled{ms: s.pending, rs: make([]Result, len(s.pending))}, true)
		s.pending = nil
	}
	_ = s.ack(s.retryIDs(), true)
	s.drop()
	return err
}

// drop lets go of the flow control of messages still held after a settle
// that failed part way: they come back after their ack deadline.
func (s *session) drop() {
	for id, w := range s.held {
		s.r.release(w)
		delete(s.held, id)
	}
}
