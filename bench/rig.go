package main

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/dedupflow/dedupflow/broker"
)

// rig is a dedupflow broker (in memory) on a loopback gRPC server of our
// own, so that an injector sits between the broker and every client.
type rig struct {
	b     *broker.Broker
	srv   *grpc.Server
	addr  string
	inj   *injector
	conn  *grpc.ClientConn // the injector's own connection, for nacks
	serve chan error
}

func startRig() (*rig, error) {
	b, err := broker.New(broker.Options{})
	if err != nil {
		return nil, fmt.Errorf("start broker: %w", err)
	}
	inj := newInjector()
	opts := append(broker.ServerOptions(),
		grpc.ChainUnaryInterceptor(inj.unary), grpc.ChainStreamInterceptor(inj.stream))
	srv := grpc.NewServer(opts...)
	b.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("listen: %w", err)
	}
	r := &rig{b: b, srv: srv, addr: lis.Addr().String(), inj: inj, serve: make(chan error, 1)}
	go func() { r.serve <- srv.Serve(lis) }()
	r.conn, err = grpc.NewClient(r.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		r.close()
		return nil, fmt.Errorf("dial broker: %w", err)
	}
	inj.nacker = pb.NewSubscriberClient(r.conn)
	return r, nil
}

// close stops the server (clients still connected are cut after 2 s) and
// the broker.
func (r *rig) close() {
	if r.conn != nil {
		r.conn.Close()
	}
	stopped := make(chan struct{})
	go func() { r.srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(2 * time.Second):
		r.srv.Stop()
		<-stopped
	}
	<-r.serve
	r.b.Close()
}

// injector watches one subscription (the contender's input) from inside
// the server. It turns the first ack of every message marked
// attrRedeliver=1 into a nack, so that the message comes back with the same
// message ID: exactly what a lost ack looks like to a consumer, injected
// the same way whatever the consumer is. It also records which message IDs
// were finally acked and when, which tells when a contender is done
// without trusting the contender's own counters.
type injector struct {
	nacker pb.SubscriberClient

	mu       sync.Mutex
	sub      string            // watched subscription; "" watches none
	ackMsg   map[string]string // ack ID -> message ID of deliveries not yet acked
	marked   map[string]bool   // ack IDs whose ack becomes a nack
	nacked   map[string]bool   // message IDs already sent back once
	acked    map[string]bool   // message IDs finally acked
	first    time.Time         // first delivery
	lastAck  time.Time
	injected atomic.Int64
}

func newInjector() *injector { return &injector{} }

// watch starts watching sub, forgetting what was seen before.
func (j *injector) watch(sub string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.sub = sub
	j.ackMsg, j.marked = map[string]string{}, map[string]bool{}
	j.nacked, j.acked = map[string]bool{}, map[string]bool{}
	j.first, j.lastAck = time.Time{}, time.Time{}
	j.injected.Store(0)
}

// progress reports distinct message IDs acked, the first delivery and the
// last ack.
func (j *injector) progress() (acked int, first, last time.Time) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.acked), j.first, j.lastAck
}

// delivered records what the server sends on a watched stream.
func (j *injector) delivered(msgs []*pb.ReceivedMessage) {
	if len(msgs) == 0 {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.first.IsZero() {
		j.first = time.Now()
	}
	for _, m := range msgs {
		id := m.GetMessage().GetMessageId()
		j.ackMsg[m.AckId] = id
		if m.GetMessage().GetAttributes()[attrRedeliver] == "1" && !j.nacked[id] {
			j.marked[m.AckId] = true
		}
	}
}

// filter splits acks into those to pass on and those to turn into nacks.
func (j *injector) filter(ids []string) (pass, nack []string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	now := time.Now()
	for _, a := range ids {
		id, known := j.ackMsg[a]
		if j.marked[a] && !j.nacked[id] {
			delete(j.marked, a)
			j.nacked[id] = true
			nack = append(nack, a)
			continue
		}
		pass = append(pass, a)
		if known {
			delete(j.ackMsg, a)
			j.acked[id] = true
			j.lastAck = now
		}
	}
	return pass, nack
}

func (j *injector) watching(sub string) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return sub != "" && sub == j.sub
}

func (j *injector) nack(ctx context.Context, sub string, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	j.injected.Add(int64(len(ids)))
	_, err := j.nacker.ModifyAckDeadline(context.WithoutCancel(ctx),
		&pb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: ids, AckDeadlineSeconds: 0})
	if err != nil {
		return fmt.Errorf("inject redelivery: %w", err)
	}
	return nil
}

// unary intercepts Acknowledge, which is how the Go clients (ours and
// Bento's) send acks.
func (j *injector) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ack, ok := req.(*pb.AcknowledgeRequest)
	if !ok || !j.watching(ack.Subscription) {
		return h(ctx, req)
	}
	pass, nack := j.filter(ack.AckIds)
	if err := j.nack(ctx, ack.Subscription, nack); err != nil {
		return nil, err
	}
	if len(pass) == 0 {
		return &emptypb.Empty{}, nil
	}
	ack.AckIds = pass
	return h(ctx, ack)
}

// stream watches StreamingPull: deliveries going out, and acks a client
// may send on the stream itself.
func (j *injector) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	if info.FullMethod != "/google.pubsub.v1.Subscriber/StreamingPull" {
		return h(srv, ss)
	}
	return h(srv, &watchedStream{ServerStream: ss, j: j})
}

type watchedStream struct {
	grpc.ServerStream
	j   *injector
	sub string
}

func (w *watchedStream) RecvMsg(m any) error {
	if err := w.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	req, ok := m.(*pb.StreamingPullRequest)
	if !ok {
		return nil
	}
	if req.Subscription != "" {
		w.sub = req.Subscription
	}
	if len(req.AckIds) == 0 || !w.j.watching(w.sub) {
		return nil
	}
	pass, nack := w.j.filter(req.AckIds)
	req.AckIds = pass
	w.j.injected.Add(int64(len(nack)))
	for _, a := range nack {
		req.ModifyDeadlineAckIds = append(req.ModifyDeadlineAckIds, a)
		req.ModifyDeadlineSeconds = append(req.ModifyDeadlineSeconds, 0)
	}
	return nil
}

func (w *watchedStream) SendMsg(m any) error {
	if resp, ok := m.(*pb.StreamingPullResponse); ok && w.j.watching(w.sub) {
		msgs := resp.ReceivedMessages
		// The broker encodes deliveries itself and hands them to gRPC as
		// the unknown fields of an empty response; read them back.
		if raw := resp.ProtoReflect().GetUnknown(); len(raw) > 0 {
			var full pb.StreamingPullResponse
			if err := proto.Unmarshal(raw, &full); err != nil {
				return fmt.Errorf("bench: read the broker's streaming pull response: %w", err)
			}
			msgs = append(msgs, full.ReceivedMessages...)
		}
		w.j.delivered(msgs)
	}
	return w.ServerStream.SendMsg(m)
}
