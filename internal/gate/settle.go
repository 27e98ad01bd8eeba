package gate

import (
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/outcome"
)

// work runs the round's jobs in one Work.Do, in batch order, and settles
// each: the keys of the messages done are committed (in one store call),
// those of the messages that failed released (in one), and the ones the
// work refused for good set aside.
func (r *run) work() {
	jobs := take(&r.jobs, func(j job) int { return j.at })
	if len(jobs) == 0 {
		return
	}
	g := r.g
	since := g.now()
	errs := r.do(jobs)
	done := g.now()
	g.release(jobs, errs)
	g.commit(r.settle(jobs, errs, since, done), done)
}

// do runs Work.Do on the jobs' items and returns its errors. Its frame is
// kept small, as every frame on the stack during the work is (see claim).
func (r *run) do(jobs []job) []error {
	g := r.g
	returned := false
	defer func() {
		if !returned {
			g.abandoned(jobs)
		}
	}()
	its := make([]*Item, len(jobs))
	for j := range jobs {
		its[j] = jobs[j].it
	}
	errs := make([]error, len(jobs))
	g.cfg.Work.Do(g.workContext(r.ctx), its, errs)
	returned = true
	return errs
}

// abandoned releases the keys of jobs whose work panicked or called
// runtime.Goexit, at once, so a replica can take the redeliveries without
// waiting out the lease; the panic goes on.
func (g *Gate) abandoned(jobs []job) {
	g.release(jobs, nil)
	g.log.Error(g.cfg.Work.Name+" did not return (panic or runtime.Goexit): keys released, messages nacked",
		"messages", len(jobs), "message_id", jobs[0].it.In.ID)
}

// settle settles each job by its work's error (the work, called at since,
// returned at done) and returns the jobs whose keys to commit.
func (r *run) settle(jobs []job, errs []error, since, done time.Time) (commits []job) {
	g := r.g
	g.m.workTime.Observe(done.Sub(since).Seconds())
	commits = make([]job, 0, len(jobs))
	var failed []job
	var cause error
	for j := range jobs {
		jb := &jobs[j]
		in := jb.it.In
		if e := errs[j]; e != nil {
			switch {
			case errors.Is(e, dedup.ErrFatal):
				g.stop(e)
				r.hold(jb.at, outcome.Retried, 0)
			case errors.Is(e, dedup.ErrPermanent):
				r.aside = append(r.aside, aside{at: jb.at, reason: e, late: jb.late})
			default:
				failed, cause = append(failed, *jb), e
				g.log.Debug(g.cfg.Work.Name+" failed: message nacked", "key", jb.it.Key, "message_id", in.ID, "err", e)
			}
			continue
		}
		if jb.file && g.cfg.Audit != nil {
			g.cfg.Audit.Add(jb.it.hash, jb.it.auditAt)
			if jb.it.LateDuplicate {
				g.m.LateSuspected()
				g.log.Debug("probable late duplicate emitted", "key", jb.it.Key, "message_id", in.ID)
			}
		}
		if jb.late {
			g.m.TooLate()
		}
		g.m.latency.Observe(done.Sub(in.PublishTime).Seconds())
		r.rs[jb.at] = outcome.Result{Outcome: jb.ok}
		if jb.claimed {
			commits = append(commits, *jb)
		}
	}
	var p time.Duration
	if g.workHealth != nil {
		switch {
		case len(failed) < len(jobs) || cause == nil: // the dependency answered
			g.workHealth.OK()
		case r.ctx.Err() == nil: // a shutdown is not an outage
			g.workHealth.Fail(since, cause)
			p = g.workHealth.Pause()
		}
	}
	for _, jb := range failed {
		r.hold(jb.at, outcome.Retried, p)
	}
	return commits
}

// commit records the keys of jobs after their work succeeded (at done),
// in one store call. The messages are acked whatever it answers — the work
// is done, and a nack would only do it again — so the commits that failed
// are retried apart from the path (see retry), never holding up the batch.
func (g *Gate) commit(jobs []job, done time.Time) {
	if again := g.commitOnce(jobs, done); len(again) > 0 {
		g.retries.Go(func() { g.retry(again, done) })
	}
}

// commitOnce commits the keys of jobs (the call made at started) and
// returns the jobs whose commit failed and is worth retrying.
func (g *Gate) commitOnce(jobs []job, started time.Time) (again []job) {
	ts := make([]dedup.Ticket, len(jobs))
	for j := range jobs {
		ts[j] = jobs[j].t
	}
	errs := make([]error, len(jobs))
	g.dd.CommitBatch(g.by.ctx(), ts, errs)
	var last error
	for j, err := range errs {
		if err == nil {
			continue
		}
		if errors.Is(err, dedup.ErrFatal) {
			g.stop(err)
			return nil
		}
		again, last = append(again, jobs[j]), err
	}
	if len(again) == 0 {
		if len(jobs) > 0 {
			g.storeHealth.OK()
		}
		return nil
	}
	// A store that cannot commit is down as surely as one that cannot
	// claim: without this, a gate whose commits all fail would look ready
	// through a whole outage.
	g.storeHealth.Fail(started, last)
	return again
}

// retry commits the keys of jobs again, backing off, until they are
// committed or half the lease after done has passed: once the lease ends a
// copy could pass. It gives up then (a copy that slips through carries the
// key) or when the gate stops on a fatal error. Drain waits for it.
func (g *Gate) retry(jobs []job, done time.Time) {
	deadline := done.Add(g.dd.Lease() / 2)
	for n := 1; len(jobs) > 0; n++ {
		pause := backoff.Delay(n, 100*time.Millisecond, 2*time.Second)
		if g.now().Add(pause).After(deadline) {
			g.log.Warn("commit after the "+g.cfg.Work.Name+" succeeded failed; the message was acked, a later copy may pass carrying the key",
				"keys", len(jobs), "key", jobs[0].it.Key, "message_id", jobs[0].it.In.ID)
			return
		}
		t := time.NewTimer(pause)
		select {
		case <-t.C:
		case <-g.done:
			t.Stop()
			return
		}
		jobs = g.commitOnce(jobs, g.now())
	}
}

// Drain waits for the commits the gate is still retrying (each ends within
// half a lease): a front end calls it once it has stopped receiving.
func (g *Gate) Drain() { g.retries.Wait() }

// release gives up, in one store call, the keys of the jobs whose work
// failed (errs[j] set; every job's when errs is nil), so those messages can
// be retried at once rather than after the lease.
func (g *Gate) release(jobs []job, errs []error) {
	var ts []dedup.Ticket
	var of []job
	for j := range jobs {
		if jb := &jobs[j]; jb.claimed && (errs == nil || errs[j] != nil) {
			ts, of = append(ts, jb.t), append(of, *jb)
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

// moveAside moves the round's unusable messages aside in one Reject call,
// in batch order, or, without Reject, holds each back before its nack.
func (r *run) moveAside() {
	as := take(&r.aside, func(a aside) int { return a.at })
	if len(as) == 0 {
		return
	}
	g := r.g
	if g.cfg.Reject == nil {
		for _, a := range as {
			r.holdBack(a.at, a.reason, "unusable message nacked; it comes back until it is removed: "+g.cfg.Hint)
		}
		return
	}
	if p := g.rejectHealth.Pause(); p > 0 {
		for _, a := range as {
			r.hold(a.at, outcome.Retried, p)
		}
		return
	}
	ins := make([]*pubsub.Message, len(as))
	reasons := make([]error, len(as))
	for j, a := range as {
		ins[j], reasons[j] = r.ins[a.at], a.reason
	}
	errs := make([]error, len(as))
	g.cfg.Reject(g.workContext(r.ctx), ins, reasons, errs)
	var failed []int
	var cause error
	moved := false
	for j, a := range as {
		in, err := ins[j], errs[j]
		switch {
		case err == nil:
			moved = true
			if a.late {
				g.m.TooLate()
			}
			g.log.Info("message dead-lettered", "message_id", in.ID, "reason", a.reason)
			r.rs[a.at] = outcome.Result{Outcome: outcome.DeadLettered}
		case errors.Is(err, dedup.ErrFatal):
			g.stop(err)
			r.hold(a.at, outcome.Retried, 0)
		case errors.Is(err, dedup.ErrPermanent):
			// The message's own fault, not the destination's: it stays
			// healthy for the others.
			r.holdBack(a.at, fmt.Errorf("%w; moving it aside failed too: %w", a.reason, err),
				"unusable message nacked: the dead-letter topic refuses it too; it comes back until it is removed")
		default:
			failed, cause = append(failed, a.at), err
			g.log.Warn("moving an unusable message aside failed; message nacked", "message_id", in.ID, "reason", a.reason, "err", err)
		}
	}
	if moved {
		g.rejectHealth.OK()
	}
	if len(failed) > 0 && r.ctx.Err() == nil {
		g.rejectHealth.Fail(time.Time{}, cause)
	}
	for _, i := range failed {
		r.hold(i, outcome.Retried, g.rejectHealth.Pause())
	}
}
