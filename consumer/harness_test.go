package consumer_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

const project = "consumer-test"

var seq atomic.Int64

// clock is the server's clock; tests move it past ack deadlines.
type clock struct {
	mu   sync.Mutex
	skew time.Duration
}

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.skew)
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	c.skew += d
	c.mu.Unlock()
}

// ackLoss swallows the first Acknowledge for a subscription once armed:
// the client believes it acked, the server never hears of it.
type ackLoss struct {
	sub  atomic.Value // string
	lost atomic.Int32
}

func (a *ackLoss) swallow(sub string) bool {
	s, _ := a.sub.Load().(string)
	return s != "" && s == sub && a.lost.CompareAndSwap(0, 1)
}

// env is one topic and one subscription (ack deadline 10 s) on a Pub/Sub
// server: pstest or the project's broker.
type env struct {
	t     *testing.T
	kind  string
	conn  []option.ClientOption
	c     *pubsub.Client
	topic string
	sub   string
	pub   *pubsub.Publisher
	clock *clock
	loss  *ackLoss
	srv   *pstest.Server // nil on the broker
}

type reactor func(req any) (bool, any, error)

func (f reactor) React(req any) (bool, any, error) { return f(req) }

// kinds are the servers every behaviour test runs against.
var kinds = []string{"pstest", "broker"}

func newEnv(t *testing.T, kind string) *env {
	t.Helper()
	e := &env{t: t, kind: kind, clock: &clock{}, loss: &ackLoss{}}
	switch kind {
	case "pstest":
		e.srv = pstest.NewServer(pstest.ServerReactorOption{FuncName: "Acknowledge", Reactor: reactor(func(req any) (bool, any, error) {
			if e.loss.swallow(req.(*pubsubpb.AcknowledgeRequest).Subscription) {
				return true, &emptypb.Empty{}, nil
			}
			return false, nil, nil
		})})
		e.srv.SetTimeNowFunc(e.clock.now)
		t.Cleanup(func() { e.srv.Close() })
		e.conn = pubsubio.Insecure(e.srv.Addr)
	case "broker":
		b, err := broker.New(broker.Options{Now: e.clock.now, Logger: testenv.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		// The broker's own Listen has no hook for a lost ack; serve it on
		// a gRPC server of ours with an interceptor that swallows one.
		lose := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			if r, ok := req.(*pubsubpb.AcknowledgeRequest); ok && e.loss.swallow(r.Subscription) {
				return &emptypb.Empty{}, nil
			}
			return h(ctx, req)
		}
		gs := grpc.NewServer(append(broker.ServerOptions(), grpc.ChainUnaryInterceptor(lose))...)
		b.Register(gs)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go gs.Serve(lis)
		t.Cleanup(func() { gs.Stop(); b.Close() })
		e.conn = pubsubio.Insecure(lis.Addr().String())
	default:
		t.Fatalf("unknown server %q", kind)
	}
	e.c = e.client()
	n := seq.Add(1)
	topic := pubsubio.Name{Project: project, Kind: "topics", ID: fmt.Sprintf("topic-%d", n)}
	sub := pubsubio.Name{Project: project, Kind: "subscriptions", ID: fmt.Sprintf("sub-%d", n)}
	ctx := context.Background()
	if err := pubsubio.EnsureTopic(ctx, e.c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, e.c, sub, topic, 10); err != nil {
		t.Fatal(err)
	}
	e.topic, e.sub = topic.String(), sub.String()
	e.pub = e.c.Publisher(e.topic)
	t.Cleanup(e.pub.Stop)
	return e
}

// client is a new connection, as another process would have.
func (e *env) client() *pubsub.Client {
	c, err := pubsubio.NewClient(context.Background(), project, e.conn...)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}

// publish publishes one message with the key in "event_id" (none if key
// is empty) and returns its message ID.
func (e *env) publish(data, key string) string {
	e.t.Helper()
	var attrs map[string]string
	if key != "" {
		attrs = map[string]string{"event_id": key}
	}
	id, err := e.pub.Publish(context.Background(), &pubsub.Message{Data: []byte(data), Attributes: attrs}).Get(context.Background())
	if err != nil {
		e.t.Fatalf("publish %q: %v", data, err)
	}
	return id
}

// receive runs f as a Receive callback on a new subscriber (over c, or the
// env's client) until the test ends.
func (e *env) receive(c *pubsub.Client, f func(context.Context, *pubsub.Message)) {
	if c == nil {
		c = e.c
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Subscriber(e.sub).Receive(ctx, f) }()
	e.t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				e.t.Errorf("receive: %v", err)
			}
		case <-time.After(20 * time.Second):
			e.t.Error("receive did not return within 20s of its cancel")
		}
	})
}

// eventually waits up to 20 s for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// calls records handler calls per key.
type calls struct {
	mu      sync.Mutex
	n       map[string]int // calls
	ok      map[string]int // calls that returned nil
	active  map[string]int
	overlap []string // keys whose handler ran twice at once
}

func newCalls() *calls {
	return &calls{n: map[string]int{}, ok: map[string]int{}, active: map[string]int{}}
}

// enter records a call for key and returns its 1-based number and a
// function to call with the handler's result.
func (c *calls) enter(key string) (int, func(error)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[key]++
	c.active[key]++
	if c.active[key] > 1 {
		c.overlap = append(c.overlap, key)
	}
	return c.n[key], func(err error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.active[key]--
		if err == nil {
			c.ok[key]++
		}
	}
}

func (c *calls) get(key string) (calls, ok int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key], c.ok[key]
}

// dup is one OnDuplicate call.
type dup struct {
	id   string
	kind string
}

type dups struct {
	mu  sync.Mutex
	all []dup
}

func (d *dups) list() []dup {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]dup(nil), d.all...)
}

func (d *dups) add(id, kind string) {
	d.mu.Lock()
	d.all = append(d.all, dup{id, kind})
	d.mu.Unlock()
}

func mustNew(t *testing.T, store dedup.Store, opt consumer.Options, f consumer.HandlerFunc) *consumer.Dedup {
	t.Helper()
	if opt.Logger == nil {
		opt.Logger = testenv.Logger()
	}
	d, err := consumer.New(store, opt, f)
	if err != nil {
		t.Fatal(err)
	}
	return d
}
