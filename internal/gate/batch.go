package gate

import (
	"context"
	"errors"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/outcome"
)

// PassBatch runs ins through the gate as one batch and sets outs[i] to the
// outcome of ins[i]: the caller acks each message whose outcome is acked
// and nacks the others, an InFlightConflict after NackDelay. A batch is a
// way to move messages, never a unit of outcome: each message keeps its own
// key, claim, outcome and ack or nack, under Pass's rules. What the batch
// shares is the calls: one store call to claim its keys, one Work.DoBatch,
// one to commit the keys whose writes succeeded and one to release those of
// the writes that failed. A copy of a key written earlier in the same batch
// is claimed again once that write is settled (a duplicate then, as Pass's
// LocalWait makes it), not nacked. In event time the messages' event times
// advance the watermark in batch order (dedup.Deduper.ClaimBatch); one too
// late to judge takes the late policy on its own.
func (g *Gate) PassBatch(ctx context.Context, ins []*pubsub.Message, outs []outcome.Outcome) {
	for range ins {
		g.m.Received()
	}
	clear(outs)
	defer func() {
		for i, o := range outs {
			if o == "" { // unwinding from a panic in the work or a callback
				o = outcome.Retried
				outs[i] = o
			}
			if a := g.cfg.ProducerAttribute; a != "" {
				g.m.CountFrom(o, ins[i].Attributes[a])
			} else {
				g.m.Count(o)
			}
		}
	}()
	g.passBatch(ctx, ins, outs)
}

// NackDelay is how long a caller of PassBatch waits before it nacks a
// message with outcome o: a copy in flight elsewhere would come straight
// back, so its nack waits the pause Pass holds such a message for (a
// StreamingPull receiver can set its ack deadline to that instead of 0).
func NackDelay(o outcome.Outcome) time.Duration {
	if o == outcome.InFlightConflict {
		return pauseDelay()
	}
	return 0
}

// job is a message to work on, with its claim's ticket (nil without
// dedup: such a message's key is not filed in the audit either).
type job struct {
	at int // its index in the batch
	it *Item
	t  *dedup.Ticket
}

func (g *Gate) passBatch(ctx context.Context, ins []*pubsub.Message, outs []outcome.Outcome) {
	if g.Err() != nil {
		fill(outs, outcome.Retried)
		return
	}
	items := make([]*Item, len(ins))
	var pending []int // keyed messages still to claim
	var work []job
	for i, in := range ins {
		it, o := g.keyed(ctx, in)
		switch {
		case it == nil:
			outs[i] = o
		case it.Source == dedup.SourceNone:
			work = append(work, job{at: i, it: it})
		default:
			items[i] = it
			pending = append(pending, i)
		}
	}
	for round := 0; len(pending) > 0 || len(work) > 0; round++ {
		var deferred []int
		var claimed time.Time
		if len(pending) > 0 {
			var more []job
			more, deferred, claimed = g.claimBatch(ctx, items, pending, outs)
			work = append(work, more...)
		}
		g.workBatch(ctx, work, outs, claimed)
		work = nil
		if len(deferred) > 0 && len(deferred) == len(pending) {
			// Every key left is being written by another batch of this
			// process: wait for those writes one message at a time, as
			// Pass does (up to LocalWait each).
			var wg sync.WaitGroup
			for _, i := range deferred {
				wg.Go(func() { outs[i] = g.decide(ctx, items[i]) })
			}
			wg.Wait()
			return
		}
		pending = deferred
	}
}

// claimBatch claims the keys of items[pending] in one store call, settles
// the duplicates, in-flight copies and failures, and returns the messages
// to work on, those whose key this process is writing (to claim again once
// that write is settled) and the clock after the claim.
func (g *Gate) claimBatch(ctx context.Context, items []*Item, pending []int, outs []outcome.Outcome) (work []job, deferred []int, claimed time.Time) {
	if err := g.storeHealth.Wait(ctx); err != nil {
		for _, i := range pending {
			outs[i] = outcome.Retried // shutting down during a pause
		}
		return nil, nil, time.Time{}
	}
	bs := make([]dedup.BatchClaim, len(pending))
	for j, i := range pending {
		bs[j] = dedup.BatchClaim{Key: items[i].hash, MsgID: items[i].In.ID, EventTime: items[i].EventTime}
	}
	start := g.now()
	g.dd.ClaimBatch(ctx, bs)
	claimed = g.now()
	var failed error
	reached := false
	for j, i := range pending {
		b, it := &bs[j], items[i]
		if b.Here {
			deferred = append(deferred, i)
			continue
		}
		if errors.Is(b.Err, dedup.ErrTooLate) { // judged without the store
			outs[i] = g.tooLate(ctx, it, b.Err)
			continue
		}
		g.m.storeTime.Observe(claimed.Sub(start).Seconds())
		if b.Err != nil {
			failed = b.Err
			outs[i] = outcome.Retried
			continue
		}
		reached = true
		switch b.Verdict.Status {
		case dedup.Duplicate:
			outs[i] = g.duplicate(ctx, it, b.Verdict)
		case dedup.InFlight:
			outs[i] = outcome.InFlightConflict
		case dedup.Proceed:
			it.LateDuplicate = g.suspect(it)
			t := b.Ticket
			work = append(work, job{at: i, it: it, t: &t})
		default:
			outs[i] = g.unknown(b.Verdict.Status, it.In.ID)
		}
	}
	if reached {
		g.storeHealth.OK()
	}
	if failed != nil {
		g.storeFailed(ctx, start, failed) // stops on a fatal error, else marks the outage and holds through its pause
	}
	return work, deferred, claimed
}

// workBatch runs the work for jobs in one call and settles each: commits
// the keys of the messages written (in one store call), releases those of
// the messages that failed (in one), and sets their outcomes as work does
// for one message. since is a clock reading taken just before (zero: read
// it).
func (g *Gate) workBatch(ctx context.Context, jobs []job, outs []outcome.Outcome, since time.Time) {
	if len(jobs) == 0 {
		return
	}
	returned := false
	defer func() {
		if !returned {
			// The work panicked or called runtime.Goexit: release the keys
			// at once, as work does; the panic goes on.
			g.releaseBatch(jobs, nil)
			g.log.Error(g.cfg.Work.Name+" did not return (panic or runtime.Goexit): keys released, messages nacked",
				"messages", len(jobs))
		}
	}()
	errs := make([]error, len(jobs))
	var err error
	if g.workHealth != nil {
		if !g.workHealth.Ready() {
			since = time.Time{} // a pause is not the work's time
		}
		err = g.workHealth.Wait(ctx)
	}
	var done time.Time
	if err != nil {
		fill(errs, err)
	} else {
		if since.IsZero() {
			since = g.now()
		}
		its := make([]*Item, len(jobs))
		for j, jb := range jobs {
			its[j] = jb.it
		}
		g.do(ctx, its, errs)
		done = g.now()
		for range jobs {
			g.m.workTime.Observe(done.Sub(since).Seconds())
		}
	}
	returned = true
	g.releaseBatch(jobs, errs)
	var commits []job
	var failed error
	emitted := 0
	for j, jb := range jobs {
		in := jb.it.In
		if e := errs[j]; e != nil {
			switch {
			case errors.Is(e, dedup.ErrFatal):
				g.stop(e)
				outs[jb.at] = outcome.Retried
			case errors.Is(e, dedup.ErrPermanent):
				outs[jb.at] = g.reject(ctx, in, e)
			default:
				failed = e
				g.log.Debug(g.cfg.Work.Name+" failed: message nacked", "key", jb.it.Key, "message_id", in.ID, "err", e)
				outs[jb.at] = outcome.Retried
			}
			continue
		}
		if jb.t != nil && g.cfg.Audit != nil {
			g.cfg.Audit.Add(jb.it.hash, jb.it.auditAt)
			if jb.it.LateDuplicate {
				g.m.LateSuspected()
				g.log.Debug("probable late duplicate emitted", "key", jb.it.Key, "message_id", in.ID)
			}
		}
		g.m.latency.Observe(done.Sub(in.PublishTime).Seconds())
		outs[jb.at] = outcome.Emitted
		emitted++
		if jb.t != nil {
			commits = append(commits, jb)
		}
	}
	if g.workHealth != nil {
		switch {
		case emitted > 0 || failed == nil: // the dependency answered
			g.workHealth.OK()
		case ctx.Err() == nil: // a shutdown is not an outage
			g.workHealth.Fail(since, failed)
		}
	}
	g.commitBatch(ctx, commits, done)
}

// do runs the work for its: Work.DoBatch, or Do for each item at once.
func (g *Gate) do(ctx context.Context, its []*Item, errs []error) {
	if g.cfg.Work.DoBatch != nil {
		g.cfg.Work.DoBatch(g.workContext(ctx), its, errs)
		return
	}
	var wg sync.WaitGroup
	for j, it := range its {
		wg.Go(func() { errs[j] = g.cfg.Work.Do(g.workContext(ctx), it) })
	}
	wg.Wait()
}

// commitBatch records the keys of jobs after their work succeeded (at
// done), as commit does for one: retrying the commits that failed within
// half the lease, then acking all the same.
func (g *Gate) commitBatch(ctx context.Context, jobs []job, done time.Time) {
	deadline := done.Add(g.dd.Lease() / 2)
	started := done // the first attempt follows the work at once
	for n := 1; len(jobs) > 0; n++ {
		ts := make([]dedup.Ticket, len(jobs))
		for j, jb := range jobs {
			ts[j] = *jb.t
		}
		errs := make([]error, len(jobs))
		g.dd.CommitBatch(g.by.ctx(), ts, errs)
		again := jobs[:0:0]
		var last error
		for j, err := range errs {
			if err == nil {
				continue
			}
			if errors.Is(err, dedup.ErrFatal) {
				g.stop(err)
				return
			}
			again, last = append(again, jobs[j]), err
		}
		if len(again) == 0 {
			g.storeHealth.OK()
			return
		}
		// A store that cannot commit is down as surely as one that cannot
		// claim: without this, a batch path whose batches all sit in these
		// retries would look ready through a whole outage.
		g.storeHealth.Fail(started, last)
		pause := backoff.Delay(n, 100*time.Millisecond, 2*time.Second)
		if g.now().Add(pause).After(deadline) {
			g.log.Warn("commit after the "+g.cfg.Work.Name+" succeeded failed; acking, a later copy may pass carrying the key",
				"keys", len(again), "key", again[0].it.Key, "message_id", again[0].it.In.ID, "err", last)
			return
		}
		_ = backoff.Sleep(context.WithoutCancel(ctx), pause)
		jobs, started = again, g.now()
	}
}

// releaseBatch gives up, in one store call, the keys of the jobs whose
// work failed (errs[j] set; every job's when errs is nil), so those
// messages can be retried at once.
func (g *Gate) releaseBatch(jobs []job, errs []error) {
	var ts []dedup.Ticket
	var of []job
	for j, jb := range jobs {
		if jb.t != nil && (errs == nil || errs[j] != nil) {
			ts, of = append(ts, *jb.t), append(of, jb)
		}
	}
	if len(ts) == 0 {
		return
	}
	rerrs := make([]error, len(ts))
	g.dd.ReleaseBatch(g.by.ctx(), ts, rerrs)
	for j, err := range rerrs {
		if err == nil {
			continue
		}
		if errors.Is(err, dedup.ErrFatal) {
			g.stop(err)
		}
		g.log.Warn("release failed; the key stays claimed until its lease ends",
			"key", of[j].it.Key, "message_id", of[j].it.In.ID, "err", err)
	}
}

func fill[T any](s []T, v T) {
	for i := range s {
		s[i] = v
	}
}
