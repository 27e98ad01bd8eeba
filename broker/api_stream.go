package broker

import (
	"errors"
	"io"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// maxStreamBatch bounds one StreamingPullResponse, in messages and bytes,
// so that a large backlog is sent as several responses the client can start
// on while the rest is in flight.
const (
	maxStreamBatch      = 1000
	maxStreamBatchBytes = 4 << 20
)

// pullStream is the broker side of one StreamingPull call. Its counters are
// guarded by b.mu; leases point back to it so that acks (which the clients
// send as unary calls) give flow-control budget back to the right stream.
type pullStream struct {
	wake     chan struct{}
	ping     chan struct{}
	outMsgs  int
	outBytes int
	maxMsgs  int // 0: no limit
	maxBytes int // 0: no limit
	deadline time.Duration
	// confirm holds the exactly-once confirmations of acks and deadline
	// changes sent on the stream, until the sending loop sends them.
	confirm *pb.StreamingPullResponse
}

// confirmLocked records, on an exactly-once subscription, the outcome of
// the ack IDs a stream request carried: the service confirms each on the
// stream, as valid or invalid, since a stream request has no reply.
func (st *pullStream) confirmLocked(ids []string, failed map[string]string, modAck bool) {
	if st.confirm == nil {
		st.confirm = &pb.StreamingPullResponse{}
	}
	var ok, invalid *[]string
	if modAck {
		c := st.confirm.ModifyAckDeadlineConfirmation
		if c == nil {
			c = &pb.StreamingPullResponse_ModifyAckDeadlineConfirmation{}
			st.confirm.ModifyAckDeadlineConfirmation = c
		}
		ok, invalid = &c.AckIds, &c.InvalidAckIds
	} else {
		c := st.confirm.AcknowledgeConfirmation
		if c == nil {
			c = &pb.StreamingPullResponse_AcknowledgeConfirmation{}
			st.confirm.AcknowledgeConfirmation = c
		}
		ok, invalid = &c.AckIds, &c.InvalidAckIds
	}
	for _, id := range ids {
		if _, bad := failed[id]; bad {
			*invalid = append(*invalid, id)
		} else {
			*ok = append(*ok, id)
		}
	}
	st.wakeUp()
}

func (st *pullStream) wakeUp() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

// streamDeadline turns stream_ack_deadline_seconds into a lease duration;
// 0 means the subscription's own deadline.
func streamDeadline(secs int32, s *subscription) (time.Duration, error) {
	switch {
	case secs == 0:
		return time.Duration(s.proto.AckDeadlineSeconds) * time.Second, nil
	case secs < 0 || secs > maxAckDeadline:
		return 0, status.Errorf(codes.InvalidArgument, "stream_ack_deadline_seconds is %d, it must be between %d and %d", secs, minAckDeadline, maxAckDeadline)
	}
	return time.Duration(max(secs, minAckDeadline)) * time.Second, nil
}

func (srv *subscriberServer) StreamingPull(stream pb.Subscriber_StreamingPullServer) error {
	req, err := stream.Recv()
	if err != nil {
		return err
	}
	b := srv.b
	st := &pullStream{
		wake:     make(chan struct{}, 1),
		ping:     make(chan struct{}, 1),
		maxMsgs:  int(max(req.MaxOutstandingMessages, 0)),
		maxBytes: int(max(req.MaxOutstandingBytes, 0)),
	}
	if err := checkStreamRequest(req); err != nil {
		return err
	}
	b.mu.Lock()
	s, err := srv.subscription(req.Subscription)
	if err == nil && s.proto.Detached {
		err = detachedError(s)
	}
	if err == nil {
		st.deadline, err = streamDeadline(req.StreamAckDeadlineSeconds, s)
	}
	if err != nil {
		b.mu.Unlock()
		return err
	}
	s.waiters[st.wake] = struct{}{}
	s.streams++
	srv.streamRequestLocked(s, st, req)
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		delete(s.waiters, st.wake)
		s.streams--
		b.mu.Unlock()
	}()

	// The receiving half runs on its own goroutine. It ends when the client
	// half-closes or the call ends (handler return, client cancel or
	// server stop), which Close waits for through b.wg.
	recvDone := make(chan error, 1)
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		for {
			r, err := stream.Recv()
			if err == nil {
				err = checkStreamRequest(r)
			}
			if err == nil && (r.MaxOutstandingMessages != 0 || r.MaxOutstandingBytes != 0 || r.ProtocolVersion != 0) {
				err = status.Error(codes.InvalidArgument, "max_outstanding_messages, max_outstanding_bytes and protocol_version can only be set on the first request of a stream")
			}
			if err != nil {
				recvDone <- err
				return
			}
			b.mu.Lock()
			srv.streamRequestLocked(s, st, r)
			b.mu.Unlock()
		}
	}()

	ctx := stream.Context()
	// The batch and its encoding are reused from one response to the next.
	var ds []delivery
	var enc []byte
	resp := &pb.StreamingPullResponse{}
	for {
		b.mu.Lock()
		if s.deleted() {
			b.mu.Unlock()
			return status.Errorf(codes.NotFound, "subscription %s was deleted", req.Subscription)
		}
		if s.proto.Detached {
			b.mu.Unlock()
			return detachedError(s)
		}
		b.fireTimersLocked(b.nowNanos())
		ds = srv.streamBatchLocked(s, st, ds[:0])
		eod, ordered, ts := s.exactlyOnce(), s.ordered(), s.transforms
		confirm := st.confirm
		st.confirm = nil
		b.mu.Unlock()
		if confirm != nil {
			if err := stream.Send(confirm); err != nil {
				return err
			}
		}
		if ts != nil && len(ds) > 0 {
			if ds = b.transformDeliveries(s, ts, ds); len(ds) == 0 {
				continue
			}
		}
		// Messages are immutable once published, so they are encoded
		// outside the lock.
		enc = appendStreamResponse(enc[:0], ds, eod, ordered)
		n := len(ds)
		clear(ds) // do not keep acknowledged messages reachable
		if n > 0 {
			err := sendEncoded(stream, resp, enc)
			if cap(enc) > maxStreamBatchBytes {
				enc = nil // a batch of large messages must not pin its buffer
			}
			if err != nil {
				return err
			}
			continue
		}
		select {
		case <-st.wake:
		case <-st.ping:
			// Clients close streams that stay silent after their keepalive
			// pings, so a ping gets an empty response.
			if err := sendEncoded(stream, resp, enc); err != nil {
				return err
			}
		case err := <-recvDone:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		case <-b.closing:
			return status.Error(codes.Unavailable, "the broker is shutting down")
		}
	}
}

// sendEncoded sends a StreamingPullResponse that appendStreamResponse
// encoded. The bytes travel as the unknown fields of an empty response: the
// protobuf runtime writes unknown fields out verbatim, and the client
// decodes them as the fields they are. Send has copied them when it
// returns, so the caller may reuse enc.
func sendEncoded(stream pb.Subscriber_StreamingPullServer, resp *pb.StreamingPullResponse, enc []byte) error {
	resp.ProtoReflect().SetUnknown(enc)
	err := stream.Send(resp)
	resp.ProtoReflect().SetUnknown(nil)
	return err
}

// streamBatchLocked leases what the stream's flow control allows, appending
// to ds.
func (srv *subscriberServer) streamBatchLocked(s *subscription, st *pullStream, ds []delivery) []delivery {
	room := maxStreamBatch
	if st.maxMsgs > 0 {
		room = min(room, st.maxMsgs-st.outMsgs)
	}
	byteRoom := maxStreamBatchBytes
	if st.maxBytes > 0 {
		byteRoom = min(byteRoom, st.maxBytes-st.outBytes)
	}
	if room <= 0 || (byteRoom <= 0 && st.outMsgs > 0) {
		return ds
	}
	return srv.b.deliverLocked(s, room, max(byteRoom, 1), st.deadline, st, ds)
}

// checkStreamRequest refuses what the proto says aborts the stream with
// INVALID_ARGUMENT: a malformed ack ID, deadlines that do not pair with
// their ack IDs, a negative deadline.
func checkStreamRequest(r *pb.StreamingPullRequest) error {
	if n, m := len(r.ModifyDeadlineAckIds), len(r.ModifyDeadlineSeconds); n != m {
		return status.Errorf(codes.InvalidArgument, "modify_deadline_seconds has %d entries and modify_deadline_ack_ids %d: they must have as many", m, n)
	}
	for i, secs := range r.ModifyDeadlineSeconds {
		if secs < 0 {
			return status.Errorf(codes.InvalidArgument, "modify_deadline_seconds[%d] is %d, it must not be negative", i, secs)
		}
	}
	for _, ids := range [][]string{r.AckIds, r.ModifyDeadlineAckIds} {
		if len(ids) > 0 {
			if err := checkAckIDs(ids); err != nil {
				return err
			}
		}
	}
	return nil
}

// streamRequestLocked applies acks, deadline changes and settings that a
// client sends on the stream (checkStreamRequest vetted it). On an
// exactly-once subscription each ack ID is confirmed on the stream as
// valid or invalid (unknown, expired, or its message delivered again);
// elsewhere unknown and expired ones are ignored, as by the service.
func (srv *subscriberServer) streamRequestLocked(s *subscription, st *pullStream, r *pb.StreamingPullRequest) {
	b := srv.b
	if s.deleted() {
		return
	}
	if len(r.AckIds) > 0 {
		failed := b.ackLocked(s, r.AckIds)
		if s.exactlyOnce() {
			st.confirmLocked(r.AckIds, failed, false)
		}
	}
	for i := range r.ModifyDeadlineAckIds {
		ids := r.ModifyDeadlineAckIds[i : i+1]
		failed := b.modAckLocked(s, ids, min(r.ModifyDeadlineSeconds[i], maxAckDeadline))
		if s.exactlyOnce() {
			st.confirmLocked(ids, failed, true)
		}
	}
	if r.StreamAckDeadlineSeconds != 0 {
		if d, err := streamDeadline(r.StreamAckDeadlineSeconds, s); err == nil {
			st.deadline = d
		}
	}
	if len(r.AckIds) == 0 && len(r.ModifyDeadlineAckIds) == 0 {
		select {
		case st.ping <- struct{}{}:
		default:
		}
	}
}
