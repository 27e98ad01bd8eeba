package pipeline_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink/topic"
	"github.com/dedupflow/dedupflow/store/mem"
)

var testSeq atomic.Int64

// rig is one pipeline between fresh topics on a Pub/Sub server.
type rig struct {
	t       *testing.T
	c       *pubsub.Client
	in, out pubsubio.Name
	dl      pubsubio.Name
	inSub   pubsubio.Name
	outSub  pubsubio.Name
	dlSub   pubsubio.Name
	p       *pipeline.Pipeline
	pub     *pubsub.Publisher
	cancel  context.CancelFunc
	done    chan error
}

type rigOpts struct {
	cfg        pipeline.Config
	now        func() time.Time // nil: time.Now
	deadLetter bool
	store      dedup.Store
	log        *slog.Logger // nil: testenv.Logger
}

func newPstest(t *testing.T, opts ...pstest.ServerReactorOption) (*pstest.Server, []option.ClientOption) {
	srv := pstest.NewServer(opts...)
	t.Cleanup(func() { srv.Close() })
	return srv, pubsubio.Insecure(srv.Addr)
}

func newRig(t *testing.T, conn []option.ClientOption, o rigOpts) *rig {
	t.Helper()
	ctx := context.Background()
	project := "test-project"
	c, err := pubsubio.NewClient(ctx, project, conn...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	n := testSeq.Add(1)
	id := fmt.Sprintf("t%d-%d", time.Now().UnixNano(), n)
	name := func(kind, s string) pubsubio.Name {
		return pubsubio.Name{Project: project, Kind: kind, ID: s + "-" + id}
	}
	r := &rig{t: t, c: c,
		in: name("topics", "in"), out: name("topics", "out"), dl: name("topics", "dl"),
		inSub: name("subscriptions", "in"), outSub: name("subscriptions", "out"), dlSub: name("subscriptions", "dl")}
	for _, tp := range []pubsubio.Name{r.in, r.out, r.dl} {
		if err := pubsubio.EnsureTopic(ctx, c, tp); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range [][2]pubsubio.Name{{r.inSub, r.in}, {r.outSub, r.out}, {r.dlSub, r.dl}} {
		if err := pubsubio.EnsureSubscription(ctx, c, s[0], s[1], 10); err != nil {
			t.Fatal(err)
		}
	}
	st := o.store
	if st == nil {
		st = mem.New()
	}
	sink := topic.New(c, r.out, 5*time.Second)
	t.Cleanup(sink.Stop)
	log := o.log
	if log == nil {
		log = testenv.Logger()
	}
	deps := pipeline.Deps{Store: st, Sink: sink, Logger: log, Now: o.now}
	if o.deadLetter {
		dl := topic.New(c, r.dl, 5*time.Second)
		t.Cleanup(dl.Stop)
		deps.DeadLetter = dl
	}
	if r.p, err = pipeline.New(o.cfg, deps); err != nil {
		t.Fatal(err)
	}
	r.pub = c.Publisher(r.in.String())
	t.Cleanup(r.pub.Stop)
	return r
}

func (r *rig) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	r.done = make(chan error, 1)
	sub := r.c.Subscriber(r.inSub.String())
	go func() { r.done <- r.p.Run(ctx, sub) }()
	r.t.Cleanup(r.stop)
}

func (r *rig) stop() {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			r.t.Errorf("pipeline: %v", err)
		}
	case <-time.After(30 * time.Second):
		r.t.Error("pipeline did not stop within 30s")
	}
}

// publish publishes one message and returns its message ID.
func (r *rig) publish(data string, attrs map[string]string) string {
	r.t.Helper()
	id, err := r.pub.Publish(context.Background(), &pubsub.Message{Data: []byte(data), Attributes: attrs}).Get(context.Background())
	if err != nil {
		r.t.Fatalf("publish %q: %v", data, err)
	}
	return id
}

// waitCounts waits until cond holds for the pipeline's counters.
func (r *rig) waitCounts(what string, cond func(pipeline.Counts) bool) pipeline.Counts {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c := r.p.Counts()
		if cond(c) {
			return c
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("timed out waiting for %s; counts: %+v", what, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type got struct {
	data  string
	attrs map[string]string
}

// drain receives from sub until quiet has passed with nothing new after at
// least want messages came (or 30 s).
func (r *rig) drain(sub pubsubio.Name, want int, quiet time.Duration) []got {
	r.t.Helper()
	var mu sync.Mutex
	var out []got
	ctx, cancel := context.WithCancel(context.Background())
	last := time.Now()
	go func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			time.Sleep(20 * time.Millisecond)
			mu.Lock()
			n, l := len(out), last
			mu.Unlock()
			if (n >= want && time.Since(l) > quiet) || time.Now().After(deadline) {
				cancel()
				return
			}
		}
	}()
	err := r.c.Subscriber(sub.String()).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		out = append(out, got{data: string(m.Data), attrs: m.Attributes})
		last = time.Now()
		mu.Unlock()
		m.Ack()
	})
	if err != nil {
		r.t.Fatalf("receive %s: %v", sub, err)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].data < out[j].data })
	return out
}

func datas(g []got) []string {
	var s []string
	for _, m := range g {
		s = append(s, m.data)
	}
	return s
}
