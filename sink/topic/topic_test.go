package topic

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/googleapis/gax-go/v2"

	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink"
)

// sinkRig is a topic with a subscription on a server, and a Sink
// that counts its publish requests.
type sinkRig struct {
	c        *pubsub.Client
	sink     *Sink
	sub      pubsubio.Name
	requests atomic.Int64
	pstest   *pstest.Server // nil on our broker

	mu   sync.Mutex
	sent []string      // the "k" attribute of every message sent, in order
	hold chan struct{} // when set, the first request waits for it to close
	held bool
	// holding is closed when the held request has arrived.
	holding chan struct{}
}

// holdFirst makes the next publish request wait until the returned
// channel is closed, so later writes gather behind it.
func (r *sinkRig) holdFirst() chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hold, r.holding = make(chan struct{}), make(chan struct{})
	return r.hold
}

func (r *sinkRig) sentKeys() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.sent...)
}

func newSinkRig(t *testing.T, server string) *sinkRig {
	t.Helper()
	ctx := context.Background()
	var addr string
	var srv *pstest.Server
	switch server {
	case "broker":
		addr = brokertest.Start(t)
	case "pstest":
		srv = pstest.NewServer()
		t.Cleanup(func() { srv.Close() })
		addr = srv.Addr
	}
	c, err := pubsubio.NewClient(ctx, "p", pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &sinkRig{c: c, sub: pubsubio.Name{Project: "p", Kind: "subscriptions", ID: "out-sub"}, pstest: srv}
	top := pubsubio.Name{Project: "p", Kind: "topics", ID: "out"}
	if err := pubsubio.EnsureTopic(ctx, c, top); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, r.sub, top, 60); err != nil {
		t.Fatal(err)
	}
	r.sink = New(c, top, 5*time.Second)
	pub := r.sink.publish
	r.sink.publish = func(ctx context.Context, req *pb.PublishRequest, opts ...gax.CallOption) (*pb.PublishResponse, error) {
		r.requests.Add(1)
		r.mu.Lock()
		for _, m := range req.Messages {
			r.sent = append(r.sent, m.Attributes["k"])
		}
		var wait chan struct{}
		if r.hold != nil && !r.held {
			r.held, wait = true, r.hold
			close(r.holding)
		}
		r.mu.Unlock()
		if wait != nil {
			<-wait
		}
		return pub(ctx, req, opts...)
	}
	return r
}

// neverAnswers makes every publish request wait for its context's end.
func (r *sinkRig) neverAnswers() {
	r.sink.publish = func(ctx context.Context, req *pb.PublishRequest, opts ...gax.CallOption) (*pb.PublishResponse, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	}
}

// receivedOnce checks that n distinct messages arrived, each once.
func (r *sinkRig) receivedOnce(t *testing.T, n int) {
	t.Helper()
	got := r.received(t, n)
	if len(got) != n {
		t.Fatalf("%d distinct messages arrived, want %d", len(got), n)
	}
	for k, c := range got {
		if c != 1 {
			t.Fatalf("message %s arrived %d times", k, c)
		}
	}
}

// refusedAlone checks the outcome of six messages of which the fourth has
// an attribute over the limit: it alone failed, as permanent, and the five
// others arrived.
func (r *sinkRig) refusedAlone(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		switch {
		case i == 3 && !errors.Is(err, sink.ErrPermanent):
			t.Errorf("message 3, with the oversized attribute: %v, want ErrPermanent", err)
		case i != 3 && err != nil:
			t.Errorf("message %d failed beside the refused one: %v", i, err)
		}
	}
	if got := r.received(t, 5); len(got) != 5 || got["3"] != 0 {
		t.Errorf("arrived %v, want the 5 valid messages", got)
	}
}

// received pulls until want messages came or 10 s passed, keyed by the
// "k" attribute. From pstest, whose streaming pull is slow, it reads what
// the server stored instead.
func (r *sinkRig) received(t *testing.T, want int) map[string]int {
	t.Helper()
	if r.pstest != nil {
		got := map[string]int{}
		for _, m := range r.pstest.Messages() {
			got[m.Attributes["k"]]++
		}
		return got
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var mu sync.Mutex
	got := map[string]int{}
	n := 0
	_ = r.c.Subscriber(r.sub.String()).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		defer mu.Unlock()
		got[m.Attributes["k"]]++
		if n++; n == want {
			cancel()
		}
	})
	return got
}

func TestSink(t *testing.T) {
	for _, server := range []string{"broker", "pstest"} {
		t.Run(server, func(t *testing.T) {
			t.Run("concurrent writes share requests and all arrive", func(t *testing.T) {
				r := newSinkRig(t, server)
				const n = 3000
				var wg sync.WaitGroup
				errs := make(chan error, n)
				for i := range n {
					wg.Add(1)
					go func() {
						defer wg.Done()
						m := &sink.Message{Data: []byte("x"), Attributes: map[string]string{"k": fmt.Sprint(i)}}
						if err := r.sink.Write(context.Background(), m); err != nil {
							errs <- err
						}
					}()
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
				reqs := r.requests.Load()
				if reqs >= n/2 {
					t.Errorf("%d writes took %d publish requests: not batched", n, reqs)
				}
				r.receivedOnce(t, n)
				t.Logf("%d writes in %d requests", n, reqs)
			})
		})
	}

	// pstest checks no limits, so a refused message needs our broker.
	t.Run("a refused message fails alone, as permanent", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		// Hold one request in flight so the next writes gather in one batch.
		release := r.holdFirst()
		ctx := context.Background()
		errs := make([]error, 6)
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				attrs := map[string]string{"k": fmt.Sprint(i)}
				if i == 3 {
					attrs["v"] = strings.Repeat("x", 2000) // over the 1024-byte value limit
				}
				errs[i] = r.sink.Write(ctx, &sink.Message{Data: []byte("x"), Attributes: attrs})
			}()
			if i == 0 {
				time.Sleep(100 * time.Millisecond) // the first write is the held request
			}
		}
		time.Sleep(100 * time.Millisecond)
		close(release)
		wg.Wait()
		r.refusedAlone(t, errs)
	})

	t.Run("stop sends what gathered at once and refuses later writes", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		ctx := context.Background()
		// The first request is held, so the second write gathers behind
		// it, below the size that would start a request of its own.
		release := r.holdFirst()
		write := func(k string) chan error {
			c := make(chan error, 1)
			go func() {
				c <- r.sink.Write(ctx, &sink.Message{Data: []byte("x"), Attributes: map[string]string{"k": k}})
			}()
			return c
		}
		held := write("a")
		time.Sleep(100 * time.Millisecond)
		gathered := write("b")
		time.Sleep(100 * time.Millisecond)
		stopped := make(chan struct{})
		go func() { r.sink.Stop(); close(stopped) }()
		select {
		case err := <-gathered:
			if err != nil {
				t.Fatalf("gathered write on Stop: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Stop did not send the gathered write while another request was in flight")
		}
		select {
		case <-stopped:
			t.Fatal("Stop returned while a request was still in flight")
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		<-stopped
		err := r.sink.Write(ctx, &sink.Message{Data: []byte("x")})
		if !errors.Is(err, ErrStopped) {
			t.Fatalf("write after Stop: %v, want ErrStopped", err)
		}
		if got := r.received(t, 2); got["a"] != 1 || got["b"] != 1 {
			t.Fatalf("arrived %v, want a and b once each", got)
		}
	})

	t.Run("a writer's context bounds its wait", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		r.neverAnswers()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		err := r.sink.Write(ctx, &sink.Message{Data: []byte("x")})
		if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sink.ErrPermanent) {
			t.Fatalf("write to a server that never answers: %v, want a transient deadline error", err)
		}
	})

	t.Run("a write given up before it was sent is not sent", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		release := r.holdFirst()
		held := make(chan error, 1)
		go func() {
			held <- r.sink.Write(context.Background(), &sink.Message{Data: []byte("x"), Attributes: map[string]string{"k": "a"}})
		}()
		time.Sleep(100 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		if err := r.sink.Write(ctx, &sink.Message{Data: []byte("x"), Attributes: map[string]string{"k": "b"}}); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("write behind a held request: %v, want its deadline", err)
		}
		close(release)
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		r.sink.Stop()
		if sent := r.sentKeys(); fmt.Sprint(sent) != "[a]" {
			t.Fatalf("sent %v, want only a: b's writer gave up (and will retry) before it was sent", sent)
		}
	})
}
