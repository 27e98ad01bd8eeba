package pull

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pubsubio"
)

var seq atomic.Int64

// env is a topic and its subscription on a server.
type env struct {
	t   *testing.T
	c   *pubsub.Client
	sub string
	pub *pubsub.Publisher
}

func newEnv(t *testing.T, host string) *env {
	t.Helper()
	ctx := context.Background()
	c, err := pubsubio.NewClient(ctx, "p-pull", pubsubio.Insecure(host)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	id := fmt.Sprintf("pull-%d-%d", time.Now().UnixNano(), seq.Add(1))
	top := pubsubio.Name{Project: "p-pull", Kind: "topics", ID: id}
	sub := pubsubio.Name{Project: "p-pull", Kind: "subscriptions", ID: id}
	if err := pubsubio.EnsureTopic(ctx, c, top); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, top, 10); err != nil {
		t.Fatal(err)
	}
	p := c.Publisher(top.String())
	t.Cleanup(p.Stop)
	return &env{t: t, c: c, sub: sub.String(), pub: p}
}

// exactlyOnce turns on exactly-once delivery on the subscription.
func (e *env) exactlyOnce() {
	e.t.Helper()
	ctx := context.Background()
	sub, err := e.c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.sub})
	if err != nil {
		e.t.Fatal(err)
	}
	sub.EnableExactlyOnceDelivery = true
	if _, err := e.c.SubscriptionAdminClient.UpdateSubscription(ctx, &pubsubpb.UpdateSubscriptionRequest{Subscription: sub,
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"enable_exactly_once_delivery"}}}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) publish(n int) {
	e.t.Helper()
	rs := make([]*pubsub.PublishResult, n)
	for i := range rs {
		rs[i] = e.pub.Publish(context.Background(), &pubsub.Message{Data: []byte(fmt.Sprint(i))})
	}
	for _, r := range rs {
		if _, err := r.Get(context.Background()); err != nil {
			e.t.Fatal(err)
		}
	}
}

func (e *env) receiver(opt Options) *Receiver {
	e.t.Helper()
	r, err := New(e.c.SubscriptionAdminClient, e.sub, opt)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

// run receives with h until stop returns true or 30 s pass, and returns
// Receive's error.
func run(t *testing.T, r *Receiver, h Handler, stop func() bool) error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- r.Receive(ctx, h) }()
	deadline := time.Now().Add(30 * time.Second)
	for !stop() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("timed out; stats %+v", r.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	return <-done
}

// seen records deliveries by message ID.
type seen struct {
	mu      sync.Mutex
	n       map[string]int
	batches []int
}

func (s *seen) add(ms []*pubsub.Message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil {
		s.n = map[string]int{}
	}
	for _, m := range ms {
		s.n[m.ID]++
	}
	s.batches = append(s.batches, len(ms))
}

func (s *seen) distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.n)
}

// TestReceiveAcksEachOnce: every message arrives, in batches, and once
// acked is not delivered again.
func TestReceiveAcksEachOnce(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		e := newEnv(t, host)
		const n = 2000
		e.publish(n)
		var s seen
		r := e.receiver(Options{Streams: 2})
		ack := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
			s.add(ms)
			for i := range rs {
				rs[i].Ack = true
			}
		}
		if err := run(t, r, ack, func() bool { return s.distinct() == n }); err != nil {
			t.Fatal(err)
		}
		largest := 0
		for _, b := range s.batches {
			largest = max(largest, b)
		}
		if largest < 2 {
			t.Errorf("batches %v: the messages came one at a time", s.batches)
		}
		for id, c := range s.n {
			if c != 1 {
				t.Errorf("message %s delivered %d times", id, c)
			}
		}
		if st := r.Stats(); st.Acked != n {
			t.Errorf("stats %+v: want %d acked", st, n)
		}
		// Nothing comes back: within a quiet second, a new receiver gets none.
		var again seen
		r2 := e.receiver(Options{})
		start := time.Now()
		count := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
			again.add(ms)
			for i := range rs {
				rs[i].Ack = true
			}
		}
		if err := run(t, r2, count, func() bool { return time.Since(start) > time.Second }); err != nil {
			t.Fatal(err)
		}
		if again.distinct() != 0 {
			t.Errorf("%d acked messages came back", again.distinct())
		}
	})
}

// TestNackComesBack: a nacked message is delivered again at once.
func TestNackComesBack(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		e := newEnv(t, host)
		const n = 100
		e.publish(n)
		var s seen
		var twice atomic.Int64
		r := e.receiver(Options{Streams: 1})
		h := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
			s.add(ms)
			s.mu.Lock()
			defer s.mu.Unlock()
			for i, m := range ms {
				rs[i].Ack = s.n[m.ID] > 1 // the second delivery is acked
				if rs[i].Ack {
					twice.Add(1)
				}
			}
		}
		if err := run(t, r, h, func() bool { return twice.Load() == n }); err != nil {
			t.Fatal(err)
		}
		if st := r.Stats(); st.Nacked < n || st.Acked != n {
			t.Errorf("stats %+v: want %d nacked, %d acked", st, n, n)
		}
	})
}

// TestFlowControl: with a batch in work, the receiver holds no more than
// MaxOutstanding messages, across its streams.
func TestFlowControl(t *testing.T) {
	e := newEnv(t, brokertest.Start(t))
	e.publish(500)
	r := e.receiver(Options{Streams: 2, MaxOutstanding: 40})
	release := make(chan struct{})
	var s seen
	h := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
		<-release
		s.add(ms)
		for i := range rs {
			rs[i].Ack = true
		}
	}
	var most atomic.Int64
	var once sync.Once
	opened := func() { once.Do(func() { close(release) }) }
	t.Cleanup(opened) // a failed run must not leave the handler blocked
	err := run(t, r, h, func() bool {
		st := r.Stats()
		most.Store(max(most.Load(), st.Received-st.Acked-st.Nacked))
		if st.Received >= 20 {
			opened()
		}
		return s.distinct() == 500
	})
	if err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m > 40 {
		t.Errorf("held %d messages at once, above MaxOutstanding 40", m)
	}
	t.Logf("held at most %d; stats %+v", most.Load(), r.Stats())
}

// TestStopSettlesInHand: at a stop, the batch being handled is finished
// and acked, and what was not handed over is nacked: it comes back at
// once, to another receiver, and nothing is delivered twice.
func TestStopSettlesInHand(t *testing.T) {
	e := newEnv(t, brokertest.Start(t))
	const n = 300
	e.publish(n)
	r := e.receiver(Options{Streams: 1, MaxBatch: 50})
	var s seen
	inHandler := make(chan struct{}, 1)
	release := make(chan struct{})
	h := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
		select {
		case inHandler <- struct{}{}:
			<-release
		default:
		}
		s.add(ms)
		for i := range rs {
			rs[i].Ack = true
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Receive(ctx, h) }()
	<-inHandler
	cancel()
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	first := s.distinct()
	if first == 0 {
		t.Fatal("the batch in hand at the stop was not finished")
	}
	r2 := e.receiver(Options{Streams: 1})
	if err := run(t, r2, h, func() bool { return s.distinct() == n }); err != nil {
		t.Fatal(err)
	}
	for id, c := range s.n {
		if c != 1 {
			t.Errorf("message %s delivered %d times", id, c)
		}
	}
	t.Logf("%d settled by the first receiver, the rest by the second", first)
}

// TestKeepalive: a stream pings, and is kept open both by a server that
// answers (ours) and by Google's emulator (528), which never answers
// protocol_version 1 pings: reopening a stream to it would strand the next
// messages on the old stream (measured: none arrived in 30 s).
func TestKeepalive(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		e := newEnv(t, host)
		r := e.receiver(Options{Streams: 1, pingEvery: 300 * time.Millisecond, serverTimeout: 150 * time.Millisecond})
		var s seen
		published := false
		ack := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
			s.add(ms)
			for i := range rs {
				rs[i].Ack = true
			}
		}
		start := time.Now()
		err := run(t, r, ack, func() bool {
			if !published && time.Since(start) > 1500*time.Millisecond {
				published = true
				e.publish(10)
			}
			return s.distinct() == 10
		})
		if err != nil {
			t.Fatal(err)
		}
		st := r.Stats()
		t.Logf("streams opened: %d", st.Streams)
		if st.Streams != 1 {
			t.Errorf("the stream was opened %d times, want once", st.Streams)
		}
	})
}

// TestReconnect: a broker that goes away and comes back on the same address
// (with its data) is read again by the same Receive, which reopens its
// stream with backoff; every message is delivered.
func TestReconnect(t *testing.T) {
	dir := t.TempDir()
	start := func(addr string) (*broker.Broker, string) {
		b, err := broker.New(broker.Options{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		a, err := b.Listen(addr)
		if err != nil {
			t.Fatal(err)
		}
		return b, a
	}
	b, addr := start("127.0.0.1:0")
	e := newEnv(t, addr)
	e.publish(50)
	r := e.receiver(Options{Streams: 1})
	var s seen
	ack := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
		s.add(ms)
		for i := range rs {
			rs[i].Ack = true
		}
	}
	restarted := false
	err := run(t, r, ack, func() bool {
		if !restarted && s.distinct() == 50 {
			restarted = true
			if err := b.Close(); err != nil {
				t.Fatal(err)
			}
			b, _ = start(addr)
			e.publish(50)
		}
		return s.distinct() == 100
	})
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Streams < 2 {
		t.Errorf("stats %+v: the stream was not reopened", st)
	}
}

// TestExactlyOnceConfirmations: on an exactly-once subscription the server
// confirms each ack sent on the stream. Acks of messages that a seek has
// handed out again are confirmed invalid and counted, exactly those, and
// the messages come back.
func TestExactlyOnceConfirmations(t *testing.T) {
	e := newEnv(t, brokertest.Start(t))
	e.exactlyOnce()
	const n = 20
	before := time.Now().Add(-time.Minute)
	e.publish(n)
	r := e.receiver(Options{Streams: 1})
	var s seen
	var seeked atomic.Bool
	h := func(ctx context.Context, ms []*pubsub.Message, rs []Result) {
		if !seeked.Swap(true) {
			// Hand everything out again while this batch is in hand.
			_, err := e.c.SubscriptionAdminClient.Seek(ctx, &pubsubpb.SeekRequest{Subscription: e.sub,
				Target: &pubsubpb.SeekRequest_Time{Time: timestamppb.New(before)}})
			if err != nil {
				t.Error(err)
			}
		}
		s.add(ms)
		for i := range rs {
			rs[i].Ack = true
		}
	}
	first := 0
	err := run(t, r, h, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		if first == 0 && len(s.batches) > 0 {
			first = s.batches[0]
		}
		again := 0
		for _, c := range s.n {
			if c > 1 {
				again++
			}
		}
		return first > 0 && again >= first && r.Stats().InvalidAcks >= int64(first)
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.InvalidAcks != int64(first) {
		t.Errorf("stats %+v: want %d invalid acks, those of the batch in hand at the seek", st, first)
	}
	// An operator sees the same on /metrics.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(r.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	want := map[string]float64{"dedupflow_invalid_acks_total": float64(first), "dedupflow_streams_opened_total": float64(r.Stats().Streams)}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("metrics %v, want %v", got, want)
	}
}

// TestOrderingAcrossBatches: on an ordered subscription the messages of
// each ordering key are handed over in publish order, within a batch and
// from one batch to the next, on every stream.
func TestOrderingAcrossBatches(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		ctx := context.Background()
		e := newEnv(t, host)
		sub, err := e.c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: e.sub})
		if err != nil {
			t.Fatal(err)
		}
		// Ordering is fixed at creation: make an ordered subscription beside.
		ordered := sub.Name + "-ordered"
		if _, err := e.c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{Name: ordered, Topic: sub.Topic,
			AckDeadlineSeconds: 10, EnableMessageOrdering: true}); err != nil {
			t.Fatal(err)
		}
		e.pub.EnableMessageOrdering = true
		keys := []string{"k1", "k2", "k3"}
		const each = 60
		var rs []*pubsub.PublishResult
		for i := range each {
			for _, k := range keys {
				rs = append(rs, e.pub.Publish(ctx, &pubsub.Message{Data: []byte(fmt.Sprint(i)), OrderingKey: k}))
			}
		}
		for _, r := range rs {
			if _, err := r.Get(ctx); err != nil {
				t.Fatal(err)
			}
		}
		r, err := New(e.c.SubscriptionAdminClient, ordered, Options{Streams: 2, MaxBatch: 7})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		got := map[string][]int{}
		batchesOf := map[string]int{}
		total := 0
		h := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
			mu.Lock()
			defer mu.Unlock()
			in := map[string]bool{}
			for i, m := range ms {
				n, err := strconv.Atoi(string(m.Data))
				if err != nil {
					t.Error(err)
				}
				got[m.OrderingKey] = append(got[m.OrderingKey], n)
				in[m.OrderingKey] = true
				rs[i].Ack = true
				total++
			}
			for k := range in {
				batchesOf[k]++
			}
		}
		if err := run(t, r, h, func() bool { mu.Lock(); defer mu.Unlock(); return total >= each*len(keys) }); err != nil {
			t.Fatal(err)
		}
		for _, k := range keys {
			if len(got[k]) != each {
				t.Errorf("key %s: %d messages, want %d", k, len(got[k]), each)
			}
			for i, n := range got[k] {
				if n != i {
					t.Errorf("key %s: message %d handed over at place %d: %v", k, n, i, got[k])
					break
				}
			}
			if batchesOf[k] < 2 {
				t.Errorf("key %s came in %d batch: the test needs it spread over several", k, batchesOf[k])
			}
		}
	})
}

// TestSilentServer: a stream whose server answered its pings and then
// answers nothing is reopened, and messages flow on the new stream. The
// first stream is cut off in the server (its responses held back), as a
// stalled proxy or a half-dead connection would. Pings go out more often
// than the timeout: the silence is timed from the oldest unanswered one.
func TestSilentServer(t *testing.T) {
	var streams atomic.Int64
	silent := make(chan struct{})
	var silence sync.Once
	addr := streamingPullVia(t, func(ss grpc.ServerStream) grpc.ServerStream {
		if streams.Add(1) == 1 {
			return &muted{ServerStream: ss, silent: silent}
		}
		return ss
	})

	e := newEnv(t, addr)
	r := e.receiver(Options{Streams: 1, pingEvery: 200 * time.Millisecond, serverTimeout: 300 * time.Millisecond})
	var s seen
	ack := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
		s.add(ms)
		for i := range rs {
			rs[i].Ack = true
		}
	}
	start := time.Now()
	published := false
	err := run(t, r, ack, func() bool {
		if time.Since(start) > time.Second { // the first stream has answered pings by now
			silence.Do(func() { close(silent) })
		}
		if !published && r.Stats().Streams >= 2 {
			published = true
			e.publish(10)
		}
		return s.distinct() == 10
	})
	if err != nil {
		t.Fatal(err)
	}
	if st := r.Stats(); st.Streams != 2 {
		t.Errorf("stats %+v: want the silent stream replaced once", st)
	}
}

// streamingPullVia starts our broker on a port of its own, each
// StreamingPull stream of which goes through wrap, and returns its address.
func streamingPullVia(t *testing.T, wrap func(grpc.ServerStream) grpc.ServerStream) string {
	t.Helper()
	b, err := broker.New(broker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	srv := grpc.NewServer(append(broker.ServerOptions(), grpc.ChainStreamInterceptor(
		func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			if info.FullMethod == "/google.pubsub.v1.Subscriber/StreamingPull" {
				ss = wrap(ss)
			}
			return h(srv, ss)
		}))...)
	b.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

// muted holds back every response of a stream once silent is closed.
type muted struct {
	grpc.ServerStream
	silent <-chan struct{}
}

func (m *muted) SendMsg(v any) error {
	select {
	case <-m.silent:
		<-m.Context().Done()
		return m.Context().Err()
	default:
		return m.ServerStream.SendMsg(v)
	}
}

// TestStopWhileServerDown: a receiver stopped while its server is down
// returns, rather than retrying to open a stream for ever.
func TestStopWhileServerDown(t *testing.T) {
	b, err := broker.New(broker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, addr)
	r := e.receiver(Options{Streams: 2})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Receive(ctx, func(context.Context, []*pubsub.Message, []Result) {}) }()
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Receive returned %v after its context ended; want nil", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Receive did not return within 30 s of its context's end while the server was down")
	}
}

// TestNewRefuses: New names what is wrong with what it is given, before
// anything reaches a server.
func TestNewRefuses(t *testing.T) {
	c, err := pubsubio.NewClient(context.Background(), "p-pull", pubsubio.Insecure("127.0.0.1:1")...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sac := c.SubscriptionAdminClient
	for _, tc := range []struct {
		sac  bool
		sub  string
		opt  Options
		want string
	}{
		{false, "projects/p/subscriptions/orders", Options{}, "no SubscriptionAdminClient"},
		{true, "orders-sub", Options{}, `subscription "orders-sub": want its full name, projects/P/subscriptions/S`},
		{true, "projects/p/topics/orders", Options{}, "malformed subscription name"},
		{true, "projects/p/subscriptions/orders", Options{AckDeadline: time.Second}, "ack deadline 1s: want 10s to 600s"},
	} {
		s := sac
		if !tc.sac {
			s = nil
		}
		if _, err := New(s, tc.sub, tc.opt); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%v, %q, %+v) = %v, want an error containing %q", tc.sac, tc.sub, tc.opt, err, tc.want)
		}
	}
}
