package gate

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/outcome"
	"github.com/dedupflow/dedupflow/store/mem"
)

// counting is a batch store that counts its batch calls.
type counting struct {
	*mem.Store
	mu                     sync.Mutex
	claims, commits, frees int
}

func (c *counting) ClaimBatch(ctx context.Context, cs []dedup.Claim, vs []dedup.Verdict, errs []error) {
	c.mu.Lock()
	c.claims++
	c.mu.Unlock()
	c.Store.ClaimBatch(ctx, cs, vs, errs)
}

func (c *counting) CommitBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	c.mu.Lock()
	c.commits++
	c.mu.Unlock()
	c.Store.CommitBatch(ctx, es, errs)
}

func (c *counting) ReleaseBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	c.mu.Lock()
	c.frees++
	c.mu.Unlock()
	c.Store.ReleaseBatch(ctx, es, errs)
}

// rig is a gate over a store, whose work fails a message whose data is
// "fail" (transiently) or "bad" (permanently), and whose Reject records
// what it was given.
type rig struct {
	g        *Gate
	mu       sync.Mutex
	written  []string // message IDs, in the order written
	rejected []string
	batches  int
	clock    time.Time // the gate's clock: a receiver's hold moves it on
}

func (r *rig) now() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.clock
}

// held moves the clock on by the longest nack delay of rs, as a receiver
// that holds those messages before their nacks lets that time pass before
// the next batch.
func (r *rig) held(rs []outcome.Result) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var d time.Duration
	for _, res := range rs {
		d = max(d, res.NackAfter)
	}
	r.clock = r.clock.Add(d)
}

func newRig(t *testing.T, s dedup.Store, missing dedup.Missing) *rig {
	return newRigIn(t, s, missing, dedup.ProcessingTime)
}

// newRigIn is newRig in the time domain domain.
func newRigIn(t *testing.T, s dedup.Store, missing dedup.Missing, domain dedup.TimeDomain) *rig {
	t.Helper()
	r := &rig{clock: time.Now()}
	do := func(_ context.Context, it *Item) error {
		switch string(it.In.Data) {
		case "fail":
			return errors.New("sink down")
		case "bad":
			return fmt.Errorf("%w: too large", dedup.ErrPermanent)
		case "fatal":
			return fmt.Errorf("%w: table dropped", dedup.ErrFatal)
		}
		r.mu.Lock()
		r.written = append(r.written, it.In.ID)
		r.mu.Unlock()
		return nil
	}
	var err error
	r.g, err = New(Config{
		Policy: dedup.Policy{IDAttribute: "key", Missing: missing, TimeDomain: domain},
		Store:  s,
		Now:    r.now,
		Work: Work{Name: "sink", Dependency: true, Do: func(ctx context.Context, its []*Item, errs []error) {
			r.mu.Lock()
			r.batches++
			r.mu.Unlock()
			for i, it := range its {
				errs[i] = do(ctx, it)
			}
		}},
		Reject: func(_ context.Context, ins []*pubsub.Message, _, _ []error) {
			r.mu.Lock()
			defer r.mu.Unlock()
			for _, in := range ins {
				r.rejected = append(r.rejected, in.ID)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// msgs makes messages from "id:key:data" specs; an empty key leaves the
// id attribute out.
func msgs(specs ...string) []*pubsub.Message {
	ms := make([]*pubsub.Message, len(specs))
	for i, s := range specs {
		p := strings.SplitN(s, ":", 3)
		m := &pubsub.Message{ID: p[0], Data: []byte(p[2]), PublishTime: time.Now(), Attributes: map[string]string{}}
		if p[1] != "" {
			m.Attributes["key"] = p[1]
		}
		ms[i] = m
	}
	return ms
}

func (r *rig) batch(ms []*pubsub.Message) []outcome.Outcome {
	rs := r.results(ms)
	outs := make([]outcome.Outcome, len(ms))
	for i := range rs {
		outs[i] = rs[i].Outcome
	}
	return outs
}

func (r *rig) results(ms []*pubsub.Message) []outcome.Result {
	rs := make([]outcome.Result, len(ms))
	r.g.PassBatch(context.Background(), ms, rs)
	r.held(rs)
	return rs
}

// pass is Pass's outcome for m.
func (r *rig) pass(m *pubsub.Message) outcome.Outcome {
	res := r.g.Pass(context.Background(), m)
	r.held([]outcome.Result{res})
	return res.Outcome
}

// TestPassBatchSameOutcomesAsPass: a stream of messages (new keys, copies
// within a batch and across batches, redeliveries, missing keys under each
// policy, failed and refused writes) gets, message by message, the outcome
// Pass gives it one at a time, in either time domain.
func TestPassBatchSameOutcomesAsPass(t *testing.T) {
	for _, domain := range []dedup.TimeDomain{dedup.ProcessingTime, dedup.EventTime} {
		t.Run(domain.String(), func(t *testing.T) { testPassBatchSameOutcomesAsPass(t, domain) })
	}
}

func testPassBatchSameOutcomesAsPass(t *testing.T, domain dedup.TimeDomain) {
	stream := []string{
		"1:a:x", "2:b:x", "3:a:x", "4:a:x", "1:a:x", // copies of a in the batch, and a redelivery of 1
		"5:c:fail", "6:d:bad", "7::x", "8:e:x",
		"9:c:x", "5:c:x", "10:b:x", "11:d:x", "7::x", // c after its failed write, copies across batches
		"12:f:x", "12:f:x", "13:f:x", "14:g:x",
	}
	// The keyless message 7, delivered twice (stream[7], stream[13]),
	// under each policy.
	keyless := map[dedup.Missing][2]outcome.Outcome{
		dedup.Fallback: {outcome.Emitted, outcome.DuplicateRedelivery},
		dedup.Reject:   {outcome.DeadLettered, outcome.DeadLettered},
		dedup.Pass:     {outcome.Emitted, outcome.Emitted},
	}
	for _, missing := range []dedup.Missing{dedup.Fallback, dedup.Reject, dedup.Pass} {
		t.Run(missing.String(), func(t *testing.T) {
			one := newRigIn(t, mem.New(), missing, domain)
			var want []outcome.Outcome
			for _, m := range msgs(stream...) {
				want = append(want, one.pass(m))
			}
			if k := keyless[missing]; want[7] != k[0] || want[13] != k[1] {
				t.Fatalf("Pass gave the keyless message %s then %s, want %s then %s", want[7], want[13], k[0], k[1])
			}
			for _, size := range []int{1, 5, 9, len(stream)} {
				b := newRigIn(t, mem.New(), missing, domain)
				var got []outcome.Outcome
				ms := msgs(stream...)
				for len(ms) > 0 {
					n := min(size, len(ms))
					got = append(got, b.batch(ms[:n])...)
					ms = ms[n:]
				}
				for i := range want {
					if got[i] != want[i] {
						t.Errorf("batches of %d, message %d (%s): %s, Pass gave %s", size, i, stream[i], got[i], want[i])
					}
				}
				if gc, wc := b.g.Counts(), one.g.Counts(); gc != wc {
					t.Errorf("batches of %d: counts %+v, Pass's %+v", size, gc, wc)
				}
			}
		})
	}
}

// TestPassBatchSettlesEachMessage: one claim, one write, one commit and one
// release for a batch; a failed write releases and nacks exactly its
// message, a refused one goes to Reject alone, the others are committed.
func TestPassBatchSettlesEachMessage(t *testing.T) {
	s := &counting{Store: mem.New()}
	r := newRig(t, s, dedup.Fallback)
	outs := r.batch(msgs("1:a:x", "2:b:fail", "3:c:bad", "4:d:x"))
	want := []outcome.Outcome{outcome.Emitted, outcome.Retried, outcome.DeadLettered, outcome.Emitted}
	for i := range want {
		if outs[i] != want[i] {
			t.Fatalf("outcomes %v, want %v", outs, want)
		}
	}
	if s.claims != 1 || s.commits != 1 || s.frees != 1 || r.batches != 1 {
		t.Errorf("%d claim, %d commit, %d release calls and %d writes for one batch, want one each",
			s.claims, s.commits, s.frees, r.batches)
	}
	if fmt.Sprint(r.rejected) != "[3]" {
		t.Errorf("rejected %v, want [3]", r.rejected)
	}
	// The failed write's key is free at once (released, not left to its
	// lease), the written ones are done.
	outs = r.batch(msgs("2:b:x", "1:a:x", "5:d:x"))
	want = []outcome.Outcome{outcome.Emitted, outcome.DuplicateRedelivery, outcome.DuplicateRepublish}
	for i := range want {
		if outs[i] != want[i] {
			t.Fatalf("after: outcomes %v, want %v", outs, want)
		}
	}
}

// TestPassBatchInFlightElsewhere: a copy whose key another replica is
// writing is nacked, after a pause, never dropped.
func TestPassBatchInFlightElsewhere(t *testing.T) {
	s := mem.New()
	a, b := newRig(t, s, dedup.Fallback), newRig(t, s, dedup.Fallback)
	writing, finish := make(chan struct{}), make(chan struct{})
	a.g.cfg.Work.Do = func(context.Context, []*Item, []error) {
		close(writing)
		<-finish
	}
	done := make(chan []outcome.Outcome)
	go func() { done <- a.batch(msgs("1:k:x")) }()
	<-writing
	rs := b.results(msgs("2:k:x", "3:other:x"))
	if rs[0].Outcome != outcome.InFlightConflict || rs[1].Outcome != outcome.Emitted {
		t.Fatalf("results %v, want in flight (nacked), emitted", rs)
	}
	if d := rs[0].NackAfter; d <= 0 {
		t.Errorf("nack delay of an in-flight copy %v, want a pause", d)
	}
	if d := rs[1].NackAfter; d != 0 {
		t.Errorf("nack delay of an emitted message %v, want none", d)
	}
	close(finish)
	if outs := <-done; outs[0] != outcome.Emitted {
		t.Fatalf("the writer's outcome %v", outs)
	}
}

// TestPassBatchFatalStops: a fatal error in the work stops the gate; that
// batch's messages and every later one are nacked.
func TestPassBatchFatalStops(t *testing.T) {
	r := newRig(t, mem.New(), dedup.Fallback)
	outs := r.batch(msgs("1:a:x", "2:b:fatal"))
	if outs[1] != outcome.Retried || r.g.Err() == nil {
		t.Fatalf("outcomes %v, gate error %v: want the fatal message retried and the gate stopped", outs, r.g.Err())
	}
	select {
	case <-r.g.Done():
	default:
		t.Fatal("Done not closed")
	}
	if outs := r.batch(msgs("3:c:x")); outs[0] != outcome.Retried {
		t.Fatalf("after the stop: %v, want retried", outs)
	}
}

// unavailable is a store that is down.
type unavailable struct{ dedup.Store }

func (unavailable) Claim(context.Context, dedup.Claim) (dedup.Verdict, error) {
	return dedup.Verdict{}, fmt.Errorf("%w: connection refused", dedup.ErrUnavailable)
}

// TestPassBatchStoreDown: with the store down every keyed message of a
// batch is nacked and the gate reports not ready; none is written.
func TestPassBatchStoreDown(t *testing.T) {
	r := newRig(t, unavailable{mem.New()}, dedup.Fallback)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms := msgs("1:a:x", "2:b:x")
	rs := make([]outcome.Result, len(ms))
	r.g.PassBatch(ctx, ms, rs)
	for i, res := range rs {
		if res.Outcome != outcome.Retried || res.NackAfter <= 0 {
			t.Fatalf("message %d: %+v, want retried after the store's pause", i, res)
		}
	}
	if r.g.Ready() || len(r.written) != 0 {
		t.Fatalf("ready %v, written %v: want not ready, nothing written", r.g.Ready(), r.written)
	}
}

// commitsFail is a store whose first commit fails; at the commit after it,
// it records whether the gate said it was ready.
type commitsFail struct {
	*mem.Store
	g           *Gate
	mu          sync.Mutex
	calls       int
	readyAtNext bool
}

func (c *commitsFail) failFirst() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	if c.calls == 1 {
		return fmt.Errorf("%w: i/o timeout", dedup.ErrUnavailable)
	}
	if c.calls == 2 {
		c.readyAtNext = c.g.Ready()
	}
	return nil
}

func (c *commitsFail) Commit(ctx context.Context, k dedup.Key, msgID string, expires time.Time) error {
	if err := c.failFirst(); err != nil {
		return err
	}
	return c.Store.Commit(ctx, k, msgID, expires)
}

func (c *commitsFail) CommitBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	if err := c.failFirst(); err != nil {
		for i := range errs {
			errs[i] = err
		}
		return
	}
	c.Store.CommitBatch(ctx, es, errs)
}

// TestCommitFailureNotReady: a store that takes claims but fails a
// commit is reported down until a commit goes through again, on both
// paths. While only commits fail (Redis frozen with SIGSTOP after the
// claims), the commits, retried apart from the batches, are the only calls
// that can tell.
func TestCommitFailureNotReady(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprintf("batch=%v", batch), func(t *testing.T) {
			s := &commitsFail{Store: mem.New()}
			r := newRig(t, s, dedup.Fallback)
			s.g = r.g
			ms := msgs("1:a:x", "2:b:x")
			var outs []outcome.Outcome
			if batch {
				outs = r.batch(ms)
			} else {
				for _, m := range ms[:1] {
					outs = append(outs, r.pass(m))
				}
			}
			if outs[0] != outcome.Emitted {
				t.Fatalf("outcome %s, want emitted", outs[0])
			}
			r.g.Drain() // the failed commit is retried apart from the batch
			if s.readyAtNext {
				t.Error("ready while retrying a failed commit: want not ready")
			}
			if !r.g.Ready() {
				t.Error("not ready after the commit went through: want ready")
			}
		})
	}
}

// TestPassBatchUnusableDoNotHoldTheOthers: with no Reject, unusable
// messages (a malformed timestamp) are nacked with a nack delay that grows
// at each delivery, and the good messages of their batch are written in
// the same call: the path holds nothing back by waiting.
func TestPassBatchUnusableDoNotHoldTheOthers(t *testing.T) {
	var written int
	g, err := New(Config{
		Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "ts"},
		Store:  mem.New(),
		Work: Work{Name: "sink", Do: func(_ context.Context, its []*Item, _ []error) {
			written += len(its)
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ms := unusableBatch(1000, 25)
	rs := make([]outcome.Result, len(ms))
	g.PassBatch(context.Background(), ms, rs)
	if written != 960 {
		t.Fatalf("%d written in the batch's call, want the 960 good messages", written)
	}
	var first []time.Duration
	for i, r := range rs {
		bad := i%25 == 0
		switch {
		case bad && (r.Outcome != outcome.Retried || r.NackAfter <= 0):
			t.Fatalf("unusable message %d: %+v, want nacked after a hold", i, r)
		case bad:
			first = append(first, r.NackAfter)
		case r.Outcome != outcome.Emitted || r.NackAfter != 0:
			t.Fatalf("good message %d: %+v, want emitted", i, r)
		}
	}
	// They come back: held longer at each delivery, up to maxRejectHold.
	for range 6 {
		g.PassBatch(context.Background(), ms[:1], rs[:1])
	}
	if rs[0].Outcome != outcome.Retried || rs[0].NackAfter <= first[0] || rs[0].NackAfter > maxRejectHold {
		t.Fatalf("7th delivery of an unusable message: %+v, want a longer hold than the first's %v, at most %v", rs[0], first[0], maxRejectHold)
	}
}

// unusableBatch is n messages with distinct keys of which every every-th
// (from the first) carries a malformed timestamp.
func unusableBatch(n, every int) []*pubsub.Message {
	ms := make([]*pubsub.Message, n)
	now := time.Now()
	for i := range ms {
		ts := fmt.Sprint(now.UnixMilli())
		if every > 0 && i%every == 0 {
			ts = "yesterday"
		}
		ms[i] = &pubsub.Message{ID: fmt.Sprint(i), Data: []byte("x"), PublishTime: now,
			Attributes: map[string]string{"key": fmt.Sprint("k", i), "ts": ts}}
	}
	return ms
}

// TestPassBatchAsideInOrder: the unusable messages of a batch and those its
// work refused go aside in one Reject call, in batch order, and messages
// too late to judge join the batch's one write in batch order too.
func TestPassBatchAsideInOrder(t *testing.T) {
	var rejects, writes [][]string
	ids := func(ins []*pubsub.Message) []string {
		var s []string
		for _, in := range ins {
			s = append(s, in.ID)
		}
		return s
	}
	clock := time.Now()
	g, err := New(Config{
		Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "ts", TimeDomain: dedup.EventTime, Late: dedup.LatePass},
		Store:  mem.New(),
		Now:    func() time.Time { return clock },
		Work: Work{Name: "sink", Do: func(_ context.Context, its []*Item, errs []error) {
			var w []string
			for i, it := range its {
				w = append(w, it.In.ID)
				if string(it.In.Data) == "bad" {
					errs[i] = fmt.Errorf("%w: too large", dedup.ErrPermanent)
				}
			}
			writes = append(writes, w)
		}},
		Reject: func(_ context.Context, ins []*pubsub.Message, _, _ []error) {
			rejects = append(rejects, ids(ins))
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	at := func(id, key, data string, ts time.Time) *pubsub.Message {
		return &pubsub.Message{ID: id, Data: []byte(data), PublishTime: clock,
			Attributes: map[string]string{"key": key, "ts": fmt.Sprint(ts.UnixMilli())}}
	}
	ancient := clock.Add(-24 * time.Hour)
	ms := []*pubsub.Message{
		at("1", "a", "x", clock), at("2", "b", "bad", clock),
		{ID: "3", Data: []byte("x"), PublishTime: clock, Attributes: map[string]string{"key": "c", "ts": "soon"}},
		at("4", "d", "x", ancient), at("5", "e", "x", clock),
	}
	rs := make([]outcome.Result, len(ms))
	g.PassBatch(context.Background(), ms, rs)
	if fmt.Sprint(writes) != "[[1 2 4 5]]" {
		t.Errorf("writes %v, want one call with 1, 2, 4 (too late, passed) and 5 in order", writes)
	}
	if fmt.Sprint(rejects) != "[[2 3]]" {
		t.Errorf("rejects %v, want one call with 2 (refused) and 3 (unusable) in order", rejects)
	}
	if c := g.Counts(); c.TooLate != 1 || c.DeadLettered != 2 || c.Emitted != 3 {
		t.Errorf("counts %+v, want 1 too late, 2 dead-lettered, 3 emitted", c)
	}
}

// TestRetaken: the work is told which keys a stopped process may have
// written already: a key taken over from a claim whose lease ran out, and
// every key in the first horizon after the gate started; afterwards, only
// the taken-over one.
func TestRetaken(t *testing.T) {
	s := mem.New()
	clock := time.Now()
	var retaken []string
	g, err := New(Config{
		Policy: dedup.Policy{IDAttribute: "key", Lease: time.Second, Horizon: time.Hour},
		Store:  s, Now: func() time.Time { return clock },
		Work: Work{Name: "sink", Do: func(_ context.Context, its []*Item, _ []error) {
			for _, it := range its {
				if it.Retaken {
					retaken = append(retaken, it.In.ID)
				}
			}
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	abandon := func(key string) { // a process that died holding key, a second ago
		if _, err := s.Claim(context.Background(), dedup.Claim{Key: dedup.KeyOf(key), MsgID: "0",
			Now: clock.Add(-2 * time.Second), LeaseUntil: clock.Add(-time.Second)}); err != nil {
			t.Fatal(err)
		}
	}
	m := func(id, key string) *pubsub.Message {
		return &pubsub.Message{ID: id, Data: []byte("x"), PublishTime: clock, Attributes: map[string]string{"key": key}}
	}
	clock = clock.Add(time.Millisecond)
	g.PassBatch(context.Background(), []*pubsub.Message{m("1", "a"), m("2", "b")}, make([]outcome.Result, 2))
	if fmt.Sprint(retaken) != "[1 2]" {
		t.Fatalf("retaken %v in the first horizon, want every message", retaken)
	}
	clock, retaken = clock.Add(time.Hour), nil
	abandon("abandoned")
	g.PassBatch(context.Background(), []*pubsub.Message{m("3", "abandoned"), m("4", "fresh")}, make([]outcome.Result, 2))
	if fmt.Sprint(retaken) != "[3]" {
		t.Fatalf("retaken %v after the first horizon, want only the key taken over from a lapsed claim", retaken)
	}
}
