package broker

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/encoding/protowire"
)

// BenchmarkReadingClient measures what the broker costs the client that
// reads from it: the official Go client (internal/reader, a process of its
// own, with the pipeline's receive settings) receives and acks a backlog of
// BROKER_BENCH_N messages (default 200000) of 100 bytes and three
// attributes; reader-us/msg is that process's CPU time per message. On a
// server of the benchmark's own ("grpc-server", as the bench's rig serves
// the broker) it also counts the streaming pull responses sent; "listen"
// serves the broker as the dedupflow broker command does. Run it once:
//
//	go test -run '^$' -bench ReadingClient -benchtime 1x ./broker
func BenchmarkReadingClient(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 200_000)
	bin := filepath.Join(b.TempDir(), "reader")
	if out, err := exec.Command("go", "build", "-o", bin, "./internal/reader").CombinedOutput(); err != nil {
		b.Fatalf("build reader: %v\n%s", err, out)
	}
	b.Run("grpc-server", func(b *testing.B) {
		var sc sendCounter
		brk, err := New(Options{Now: time.Now, Logger: testLogger(b)})
		if err != nil {
			b.Fatal(err)
		}
		srv := grpc.NewServer(append(ServerOptions(), grpc.StreamInterceptor(sc.intercept))...)
		brk.Register(srv)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		served := make(chan struct{})
		go func() { defer close(served); srv.Serve(lis) }()
		b.Cleanup(func() { srv.Stop(); <-served; brk.Close() })
		readBacklog(b, bin, lis.Addr().String(), n, &sc)
	})
	b.Run("listen", func(b *testing.B) {
		readBacklog(b, bin, startOurs(b, Options{Now: time.Now}).addr, n, nil)
	})
}

// readBacklog publishes n messages to a new subscription and runs the
// reader over them, b.N times; sc, if set, counts the responses.
func readBacklog(b *testing.B, bin, addr string, n int, sc *sendCounter) {
	const batch = 1000 // messages per publish request
	n = max(n/batch, 1) * batch
	c := newClient(b, addr)
	ctx := context.Background()
	data := make([]byte, 100)
	var cpu, wall time.Duration
	var resps, msgs int64
	for range b.N {
		b.StopTimer() // the backlog is published outside the timing
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60})
		req := &pb.PublishRequest{Topic: topic, Messages: make([]*pb.PubsubMessage, batch)}
		for i := 0; i < n; i += batch {
			for j := range req.Messages {
				req.Messages[j] = &pb.PubsubMessage{Data: data, Attributes: map[string]string{
					"key": "k" + strconv.Itoa(i+j), "seq": strconv.Itoa(i + j), "copy": "0"}}
			}
			if _, err := c.TopicAdminClient.Publish(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
		if sc != nil {
			sc.resps.Store(0)
			sc.msgs.Store(0)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		cmd := exec.CommandContext(rctx, bin, "-addr", addr, "-sub", sub.Name, "-n", strconv.Itoa(n))
		b.StartTimer()
		start := time.Now()
		out, err := cmd.CombinedOutput()
		wall += time.Since(start)
		cancel()
		if err != nil {
			b.Fatalf("reader: %v\n%s", err, out)
		}
		cpu += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
		if sc != nil {
			resps += sc.resps.Load()
			msgs += sc.msgs.Load()
		}
	}
	total := float64(b.N * n)
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/total, "reader-us/msg")
	b.ReportMetric(total/wall.Seconds(), "recv-msg/s")
	if resps > 0 {
		b.ReportMetric(float64(msgs)/float64(resps), "msgs/response")
	}
}

// sendCounter counts the StreamingPull responses that carry messages, and
// their messages.
type sendCounter struct{ resps, msgs atomic.Int64 }

func (sc *sendCounter) intercept(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	return h(srv, &countedStream{ServerStream: ss, sc: sc})
}

type countedStream struct {
	grpc.ServerStream
	sc *sendCounter
}

func (s *countedStream) SendMsg(m any) error {
	if resp, ok := m.(*pb.StreamingPullResponse); ok {
		// The broker hands its own encoding over as unknown fields.
		k := len(resp.ReceivedMessages)
		for raw := resp.ProtoReflect().GetUnknown(); len(raw) > 0; {
			num, typ, n := protowire.ConsumeTag(raw)
			if n < 0 {
				break
			}
			m := protowire.ConsumeFieldValue(num, typ, raw[n:])
			if m < 0 {
				break
			}
			if num == 1 { // received_messages
				k++
			}
			raw = raw[n+m:]
		}
		if k > 0 {
			s.sc.resps.Add(1)
			s.sc.msgs.Add(int64(k))
		}
	}
	return s.ServerStream.SendMsg(m)
}
