package gate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/outcome"
)

// Pass runs one message through the gate: PassBatch of one. The caller
// settles it as the result says (outcome.Result.Settle).
func (g *Gate) Pass(ctx context.Context, in *pubsub.Message) outcome.Result {
	var r [1]outcome.Result
	g.PassBatch(ctx, []*pubsub.Message{in}, r[:])
	return r[0]
}

// PassBatch runs ins through the gate and sets rs[i] to the result of
// ins[i]: the caller acks each message whose outcome is acked and nacks
// the others, each after its NackAfter. A batch is a way to move messages,
// never a unit of outcome: each message keeps its own key, claim, outcome
// and ack or nack. What the batch shares is the calls: one store call to
// claim its keys, one Work.Do, one to commit the keys whose work succeeded,
// one to release those whose work failed, and one Reject. Nothing in it
// waits on a timer: a message that cannot go on yet gets a nack delay, so
// it never holds up the others. A copy of a key written earlier in the
// same batch is claimed again once that write is settled (a duplicate
// then), not nacked. In event time the messages' event times advance the
// watermark in batch order (dedup.Deduper.ClaimBatch).
func (g *Gate) PassBatch(ctx context.Context, ins []*pubsub.Message, rs []outcome.Result) {
	g.m.Received(len(ins))
	clear(rs)
	defer g.counted(ins, rs)
	if g.Err() != nil {
		for i := range rs {
			rs[i].Outcome = outcome.Retried
		}
		return
	}
	r := &run{g: g, ctx: ctx, ins: ins, rs: rs}
	r.pass()
}

// counted counts each message's outcome once PassBatch ends, also when it
// unwinds from a panic in the work or a callback: a message without an
// outcome then is retried.
func (g *Gate) counted(ins []*pubsub.Message, rs []outcome.Result) {
	// Each outcome is counted once per batch: each count is an atomic add,
	// which the streams contend on.
	var tally [len(all)]int
	for i := range rs {
		if rs[i].Outcome == "" {
			rs[i] = outcome.Result{Outcome: outcome.Retried}
		}
		if a := g.cfg.ProducerAttribute; a != "" {
			g.m.CountFrom(rs[i].Outcome, ins[i].Attributes[a])
		} else if k := index(rs[i].Outcome); k >= 0 {
			tally[k]++
		}
	}
	for k, n := range tally {
		if n > 0 {
			g.m.Count(all[k], n)
		}
	}
}

// run is one PassBatch on its way: what each message is waiting for.
type run struct {
	g   *Gate
	ctx context.Context
	ins []*pubsub.Message
	rs  []outcome.Result

	items []Item  // the messages' items, by index, in one allocation
	jobs  []job   // to work on this round
	aside []aside // to move aside this round
}

// job is a message to work on.
type job struct {
	at int // its index in the batch
	it *Item
	t  dedup.Ticket // its claim, if claimed
	// claimed: t holds a claim (not so without dedup, too late, or for a
	// shadowed copy); file: file the key in the audit once done; ok: the
	// outcome then (emitted, or a shadowed copy's kind); late: too late to
	// judge.
	claimed, file bool
	ok            outcome.Outcome
	late          bool
}

// aside is a message to move aside, and why.
type aside struct {
	at     int
	reason error
	late   bool
}

// pass runs the rounds: claim what is keyed, work on what proceeds, move
// aside what cannot be used. A key this batch was writing is claimed again
// in the next round, once its write is settled.
func (r *run) pass() {
	pending := r.key()
	for {
		if p := r.g.workPause(); p > 0 {
			// The work's dependency is down: nothing is claimed for it
			// until the pause ends.
			for _, i := range pending {
				r.hold(i, outcome.Retried, p)
			}
			pending = pending[:0]
		}
		var deferred []int
		if len(pending) > 0 {
			deferred = r.claim(pending)
		}
		r.work()
		r.moveAside()
		if len(deferred) == 0 {
			return
		}
		if len(deferred) == len(pending) && !r.await(deferred) {
			return
		}
		pending = deferred
	}
}

// key takes each message's event time and key. An unusable message is set
// aside; one without dedup becomes a job; the keyed ones are returned to
// claim.
func (r *run) key() (pending []int) {
	g := r.g
	r.items = make([]Item, len(r.ins))
	r.jobs = make([]job, 0, len(r.ins))
	for i, in := range r.ins {
		it := &r.items[i]
		*it = Item{In: in, EventTime: in.PublishTime}
		if a := g.cfg.TimestampAttribute; a != "" {
			t, err := dedup.ParseTimestamp(in.Attributes[a])
			if err != nil {
				r.aside = append(r.aside, aside{at: i, reason: fmt.Errorf("attribute %q: %w", a, err)})
				continue
			}
			it.EventTime = t
		}
		key, src, missing, err := g.cfg.Derive(in.Attributes, in.Data, in.ID)
		if missing {
			g.m.Missing(in.Attributes[g.cfg.ProducerAttribute])
		}
		if err != nil {
			r.aside = append(r.aside, aside{at: i, reason: err})
			continue
		}
		if missing {
			g.warnMissing(in.Attributes[g.cfg.ProducerAttribute])
		}
		if it.Source = src; src == dedup.SourceNone {
			r.jobs = append(r.jobs, job{at: i, it: it, ok: outcome.Emitted})
			continue
		}
		it.Key, it.hash = key, dedup.KeyOf(key)
		if g.cfg.Audit != nil { // the clock is read per message only for the audit
			it.auditAt = g.auditTime(it.EventTime)
		}
		pending = append(pending, i)
	}
	return pending
}

// claim claims the keys of the pending messages in one store call and
// sorts each by its verdict. It returns the messages whose key this
// process is writing right now, to claim again. Its frame is kept small,
// as every frame on the stack during the store call is: a receiver that
// runs each message on a goroutine of its own pays for each growth of
// that goroutine's stack.
func (r *run) claim(pending []int) (deferred []int) {
	g := r.g
	if p := g.storeHealth.Pause(); p > 0 {
		// The store is down: hold the messages through what is left of
		// its pause, so they come back when the next probe is due.
		for _, i := range pending {
			r.hold(i, outcome.Retried, p)
		}
		return nil
	}
	bs := make([]dedup.BatchClaim, len(pending))
	for j, i := range pending {
		b, it := &bs[j], &r.items[i]
		b.Key, b.MsgID, b.EventTime = it.hash, it.In.ID, it.EventTime
	}
	start := g.now()
	g.dd.ClaimBatch(r.ctx, bs)
	return r.answered(pending, bs, start)
}

// answered sorts the messages of a claim call made at start by their verdicts
// and returns those to claim again.
func (r *run) answered(pending []int, bs []dedup.BatchClaim, start time.Time) (deferred []int) {
	g := r.g
	asked := false
	var failed []int
	var cause error
	for j, i := range pending {
		b, it := &bs[j], &r.items[i]
		switch {
		case b.Here:
			deferred = append(deferred, i)
		case errors.Is(b.Err, dedup.ErrTooLate): // judged without the store
			r.tooLate(i, it, b.Err)
		case b.Err != nil:
			asked, failed, cause = true, append(failed, i), b.Err
		default:
			asked = true
			r.judged(i, it, b, start)
		}
	}
	if !asked {
		return deferred
	}
	g.m.storeTime.Observe(g.now().Sub(start).Seconds())
	if len(failed) < len(pending)-len(deferred) {
		g.storeHealth.OK()
	}
	if len(failed) > 0 {
		p := g.storeFailed(r.ctx, start, cause)
		for _, i := range failed {
			r.hold(i, outcome.Retried, p)
		}
	}
	return deferred
}

// judged maps the verdict of a claim made at start to what happens to its
// message.
func (r *run) judged(i int, it *Item, b *dedup.BatchClaim, start time.Time) {
	g := r.g
	switch b.Verdict.Status {
	case dedup.Duplicate:
		r.duplicate(i, it, &b.Verdict)
	case dedup.InFlight:
		// It comes back once nacked; the delay keeps that from turning
		// into a hot loop while the first copy is worked on.
		r.hold(i, outcome.InFlightConflict, pauseDelay())
	case dedup.Proceed:
		it.LateDuplicate = g.suspect(it)
		it.Retaken = b.Verdict.Retaken || g.mayBeRetaken(start)
		r.jobs = append(r.jobs, job{at: i, it: it, t: b.Ticket, claimed: true, file: true, ok: outcome.Emitted})
	default:
		g.log.Error("dedup store answered an unknown status; message nacked", "status", b.Verdict.Status, "message_id", it.In.ID)
		r.rs[i] = outcome.Result{Outcome: outcome.Retried}
	}
}

// duplicate counts a caught copy (in shadow mode, works on it all the same).
func (r *run) duplicate(i int, it *Item, v *dedup.Verdict) {
	g := r.g
	o, delay := outcome.DuplicateRepublish, g.m.republishDelay
	if v.Kind == dedup.Redelivery {
		o, delay = outcome.DuplicateRedelivery, g.m.redeliveryDelay
	}
	if !v.Expires.IsZero() {
		delay.Observe(v.Age.Seconds())
	}
	if g.cfg.OnDuplicate != nil {
		g.cfg.OnDuplicate(r.ctx, it.In, v.Kind)
	}
	if g.cfg.Shadow {
		r.jobs = append(r.jobs, job{at: i, it: it, ok: o})
		return
	}
	r.rs[i] = outcome.Result{Outcome: o}
}

// tooLate applies the late policy to a message the horizon cannot judge.
// Passed on, it is still checked against the audit, which remembers far
// longer than the horizon.
func (r *run) tooLate(i int, it *Item, reason error) {
	if r.g.cfg.Late == dedup.LateDeadLetter {
		r.aside = append(r.aside, aside{at: i, reason: reason, late: true})
		return
	}
	it.LateDuplicate = r.g.suspect(it)
	r.jobs = append(r.jobs, job{at: i, it: it, file: true, ok: outcome.Emitted, late: true})
}

// await handles a round in which every key left is being written by
// another call of this process. Alone in its batch, a message waits for
// that write (it ends within a lease), as nothing else waits on it, and is
// then claimed again: a duplicate, where a nack would cost a redelivery.
// In a batch it would hold up the others, so it is nacked after a pause.
func (r *run) await(deferred []int) (again bool) {
	if len(r.ins) == 1 && r.g.dd.Await(r.ctx, r.items[deferred[0]].hash, r.g.dd.Lease()) {
		return true
	}
	for _, i := range deferred {
		r.hold(i, outcome.InFlightConflict, pauseDelay())
	}
	return false
}

// hold nacks message i after d.
func (r *run) hold(i int, o outcome.Outcome, d time.Duration) {
	r.rs[i] = outcome.Result{Outcome: o, NackAfter: d}
}

// recovery is the least time after the gate starts in which a message may
// meet a write a stopped process left in flight: Pub/Sub's longest ack
// deadline, after which that process's own messages have come back.
const recovery = 10 * time.Minute

// mayBeRetaken says whether a key claimed at t may have a write in flight
// from a process that stopped before it committed the key: a stopped
// process's claims are not kept by the memory and disk stores, and a copy
// of one of its keys may come up to a horizon later (its redelivery,
// within the longest ack deadline). So every key claimed in the first
// horizon (at least recovery) after the gate started. t is the claim
// call's time, read once per batch.
func (g *Gate) mayBeRetaken(t time.Time) bool {
	return t.Before(g.started.Add(max(g.dd.Horizon(), recovery)))
}

// storeFailed records a claim call made at start that failed, and returns
// how long to hold its messages.
func (g *Gate) storeFailed(ctx context.Context, start time.Time, err error) time.Duration {
	switch {
	case ctx.Err() != nil: // a shutdown is not an outage
	case errors.Is(err, dedup.ErrFatal):
		g.stop(err)
	default:
		g.storeHealth.Fail(start, err)
	}
	return g.storeHealth.Pause()
}

// workPause is what is left of the pause of the work's dependency.
func (g *Gate) workPause() time.Duration {
	if g.workHealth == nil {
		return 0
	}
	return g.workHealth.Pause()
}

// maxRejectHold caps the hold of an unusable message without Reject,
// which grows at each of its deliveries: the cap bounds how long it takes
// a slot of the subscriber's flow control.
const maxRejectHold = 5 * time.Second

// holdBack holds an unusable message that cannot be moved aside before its
// nack, longer at each delivery, and logs it at the 1st, 10th, 100th...:
// else a handful of them floods the log and spins the receiver.
func (r *run) holdBack(i int, reason error, msg string) {
	g, in := r.g, r.ins[i]
	g.m.held.Inc()
	d := g.hold.Next(in.ID, 100*time.Millisecond, maxRejectHold, func(n int) {
		g.log.Error(msg, "message_id", in.ID, "deliveries", n, "reason", reason)
	})
	r.hold(i, outcome.Retried, d)
}

// pauseDelay is the hold of a copy whose key is in flight elsewhere,
// jittered so replicas do not retry in step.
func pauseDelay() time.Duration { return backoff.Delay(1, 100*time.Millisecond, time.Second) }

// Each makes a Work.Do of a step that takes one item at a time: it runs
// do for every item at once.
func Each(do func(ctx context.Context, it *Item) error) func(ctx context.Context, its []*Item, errs []error) {
	return func(ctx context.Context, its []*Item, errs []error) {
		if len(its) == 1 {
			errs[0] = do(ctx, its[0])
			return
		}
		var wg sync.WaitGroup
		for i, it := range its {
			wg.Go(func() { errs[i] = do(ctx, it) })
		}
		wg.Wait()
	}
}

// take empties a round's list of messages and returns them in batch
// order, by at: outputs and dead letters go out in the order the messages
// came.
func take[T any](list *[]T, at func(T) int) []T {
	s := *list
	*list = nil
	slices.SortFunc(s, func(a, b T) int { return at(a) - at(b) })
	return s
}
