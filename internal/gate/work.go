package gate

import (
	"context"
	"errors"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/outcome"
)

// auditTime is the time the audit files a key under: the processing clock,
// or in event time the event time, held back to the processing clock (as
// the watermark is) so a producer's future-dated clock cannot rotate every
// generation out.
func (g *Gate) auditTime(et time.Time) time.Time {
	now := g.now()
	if g.dd.Domain() == dedup.EventTime && et.Before(now) {
		return et
	}
	return now
}

// suspect asks the audit whether a key the exact horizon no longer holds
// was seen before, and records how late the copy came.
func (g *Gate) suspect(it *Item) bool {
	if g.cfg.Audit == nil {
		return false
	}
	seen, ok := g.cfg.Audit.Seen(it.hash, it.auditAt)
	if ok {
		g.m.lateDelay.Observe(max(it.auditAt.Sub(seen), 0).Seconds())
	}
	return ok
}

// work runs the front end's step; with a ticket, it commits the key after
// success and releases it otherwise. With a note, the key goes into the
// audit once the work is done. since is a clock reading taken just before,
// which the work's time is measured from unless a pause comes between;
// zero: the clock is read.
func (g *Gate) work(ctx context.Context, it *Item, t *dedup.Ticket, audit bool, since time.Time) outcome.Outcome {
	returned := false
	if t != nil {
		defer func() {
			if !returned {
				// The work panicked or called runtime.Goexit: release the
				// key at once, so a replica can take the redelivery
				// without waiting out the lease; the panic goes on.
				g.release(it, *t)
				g.log.Error(g.cfg.Work.Name+" did not return (panic or runtime.Goexit): key released, message nacked",
					"key", it.Key, "message_id", it.In.ID)
			}
		}()
	}
	var err error
	if g.workHealth != nil {
		if !g.workHealth.Ready() {
			since = time.Time{} // a pause is not the work's time
		}
		err = g.workHealth.Wait(ctx)
	}
	var done time.Time
	if err == nil {
		if since.IsZero() {
			since = g.now()
		}
		err = g.cfg.Work.Do(g.workContext(ctx), it)
		done = g.now()
		g.m.workTime.Observe(done.Sub(since).Seconds())
	}
	returned = true
	if err != nil {
		if t != nil {
			g.release(it, *t)
		}
		switch {
		case errors.Is(err, dedup.ErrFatal):
			g.stop(err)
			return outcome.Retried
		case errors.Is(err, dedup.ErrPermanent):
			return g.reject(ctx, it.In, err)
		}
		if g.workHealth != nil && ctx.Err() == nil {
			g.workHealth.Fail(since, err)
		}
		g.log.Debug(g.cfg.Work.Name+" failed: message nacked", "key", it.Key, "message_id", it.In.ID, "err", err)
		return outcome.Retried
	}
	if g.workHealth != nil {
		g.workHealth.OK()
	}
	if audit && g.cfg.Audit != nil {
		g.cfg.Audit.Add(it.hash, it.auditAt)
		if it.LateDuplicate {
			g.m.LateSuspected()
			g.log.Debug("probable late duplicate emitted", "key", it.Key, "message_id", it.In.ID)
		}
	}
	g.m.latency.Observe(done.Sub(it.In.PublishTime).Seconds())
	if t != nil {
		g.commit(ctx, it, *t, done)
	}
	return outcome.Emitted
}

// commit records the key after the work succeeded (at done), retrying
// within half the lease: once the lease ends a copy could pass. If the
// store stays down the input is acked all the same — the work is done, and
// a nack would only do it again — and a copy that slips through carries
// the key. Its pauses outlive a shutdown of ctx.
func (g *Gate) commit(ctx context.Context, it *Item, t dedup.Ticket, done time.Time) {
	deadline := done.Add(g.dd.Lease() / 2)
	started := done // the first attempt follows the work at once
	for n := 1; ; n++ {
		err := g.dd.Commit(g.by.ctx(), t)
		if err == nil {
			g.storeHealth.OK()
			return
		}
		if errors.Is(err, dedup.ErrFatal) {
			g.stop(err)
			return
		}
		g.storeHealth.Fail(started, err) // the store is down: /readyz says so, claims pause
		pause := backoff.Delay(n, 100*time.Millisecond, 2*time.Second)
		if g.now().Add(pause).After(deadline) {
			g.log.Warn("commit after the "+g.cfg.Work.Name+" succeeded failed; acking, a later copy may pass carrying the key",
				"key", it.Key, "message_id", it.In.ID, "err", err)
			return
		}
		_ = backoff.Sleep(context.WithoutCancel(ctx), pause)
		started = g.now()
	}
}

// release gives the key up after failed work, so the message can be
// retried at once rather than after the lease.
func (g *Gate) release(it *Item, t dedup.Ticket) {
	err := g.dd.Release(g.by.ctx(), t)
	if err == nil {
		return
	}
	if errors.Is(err, dedup.ErrFatal) {
		g.stop(err)
	}
	g.log.Warn("release failed; the key stays claimed until its lease ends",
		"key", it.Key, "message_id", it.In.ID, "err", err)
}
