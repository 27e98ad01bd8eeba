package consumer

import (
	"context"
	"math/rand/v2"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
)

const (
	// conflictHold is how long a message is held before a nack that would
	// otherwise bring it straight back unchanged (its key is in flight, or
	// it has no usable key). Pub/Sub redelivers a nacked message at once
	// unless the subscription has a retry policy; without the hold, one
	// such message would spin between server and client.
	conflictHold = 250 * time.Millisecond
	// maxRejectHold caps the hold of a message without a usable key, which
	// grows at each of its deliveries (it will never become usable); the
	// cap bounds how long it takes a slot of MaxOutstandingMessages.
	maxRejectHold = 5 * time.Second
	// settleTimeout bounds a commit or release. They run on a context
	// detached from Receive's, so a shutdown does not leave a handled key
	// pending until its lease ends.
	settleTimeout = 10 * time.Second
)

// Handle is the callback for Subscriber.Receive: it runs the handler
// unless the key was already handled within the horizon, then acks or
// nacks m.
//
//   - The handler returned nil: commit the key, ack.
//   - It returned an error: release the key, nack; the redelivery runs it
//     again.
//   - A duplicate (the key was handled within the horizon): OnDuplicate,
//     then ack; the handler is not called.
//   - The key is being handled right now, here or by a replica sharing the
//     store: hold briefly, nack. It comes back and is then a duplicate (or,
//     if that handler failed, runs).
//   - The store is unreachable: hold the message while the store backs off
//     (100ms doubling to 5s, jittered), then nack. Later messages wait
//     out the same pause before they try, so a store outage is a trickle
//     of probes, not a hot loop of redeliveries.
//   - No usable key (see Options.OnReject): OnReject, or hold and nack.
//
// A panic in the handler releases the key (synchronously, so a replica
// sharing the store can take the redelivery at once instead of after the
// lease), nacks, and then goes on unrecovered, exactly as it would without
// this wrapper: Receive does not recover panics, so the process exits
// with the original stack. A panic is a bug, not a failed message;
// recovering it would keep a process running whose state the panic may
// have left half-updated, and would turn a poison message into an endless,
// quiet redelivery loop in a process that looks healthy. A handler that
// wants a panic treated as a failure can recover it and return an error.
// The same cleanup runs if the handler calls runtime.Goexit.
func (d *Dedup) Handle(ctx context.Context, m *pubsub.Message) {
	d.m.Received()
	settled := false
	defer func() {
		if !settled {
			// Unwinding from a panic (or Goexit) in the handler or a
			// callback: nack, so the message is not held until its ack
			// deadline if the process survives. If it does not, the nack
			// may not be sent; the deadline brings the message back.
			m.Nack()
			d.m.Count(Retried)
		}
	}()
	o := d.handle(ctx, m)
	settled = true
	d.m.Count(o)
	if o.Acked() {
		m.Ack()
	} else {
		m.Nack()
	}
}

func (d *Dedup) handle(ctx context.Context, m *pubsub.Message) Outcome {
	key, src, missing, err := d.rule.Derive(m.Attributes, m.ID)
	if missing {
		d.m.Missing(m.Attributes[d.opt.ProducerAttribute])
	}
	if err != nil {
		return d.reject(ctx, m, err)
	}
	if src == dedup.NoKey { // dedup.Pass: the handler runs without a claim
		return d.run(ctx, m, "", nil)
	}

	if err := d.store.Wait(ctx); err != nil {
		return Retried // shutting down during a pause
	}
	start := d.now()
	v, t, err := d.dd.Claim(ctx, dedup.KeyOf(key), m.ID)
	d.m.storeTime.Observe(max(d.now().Sub(start)-v.Waited, 0).Seconds()) // a wait for our own handler is not the store's
	if err != nil {
		if ctx.Err() != nil {
			return Retried // Receive is shutting down; the store is fine
		}
		d.store.Fail(err)
		// Hold the message through the pause instead of nacking it at
		// once: it would come straight back and find the store still down.
		_ = d.store.Wait(ctx)
		return Retried
	}
	d.store.OK()
	switch v.Status {
	case dedup.Duplicate:
		o := DuplicateRepublish
		if v.Kind == dedup.Redelivery {
			o = DuplicateRedelivery
		}
		if d.opt.OnDuplicate != nil {
			d.opt.OnDuplicate(ctx, view(m), v.Kind)
		}
		return o
	case dedup.InFlight:
		hold(ctx, conflictHold)
		return InFlightConflict
	case dedup.Proceed:
		return d.run(ctx, m, key, &t)
	}
	d.log.Error("dedup store answered an unknown status; message nacked", "status", v.Status, "message_id", m.ID)
	return Retried
}

// run calls the handler and, with a ticket, commits the key on success
// and releases it otherwise.
func (d *Dedup) run(ctx context.Context, m *pubsub.Message, key string, t *dedup.Ticket) Outcome {
	bg := context.WithoutCancel(ctx)
	returned := false
	if t != nil {
		defer func() {
			if returned {
				return
			}
			// The handler panicked or called runtime.Goexit; the panic
			// goes on after this (see Handle for why).
			sctx, cancel := context.WithTimeout(bg, settleTimeout)
			defer cancel()
			if err := d.dd.Release(sctx, *t); err != nil {
				d.log.Warn("release after a handler panic failed; the key stays claimed until its lease ends",
					"key", key, "message_id", m.ID, "err", err)
			}
			d.log.Error("handler did not return (panic or runtime.Goexit): key released, message nacked",
				"key", key, "message_id", m.ID)
		}()
	}

	hctx := ctx
	if key != "" {
		hctx = context.WithValue(ctx, keyCtx{}, key)
	}
	hctx, cancel := context.WithTimeout(hctx, d.opt.HandlerTimeout)
	start := d.now()
	err := d.f(hctx, view(m))
	cancel()
	returned = true
	took := d.now().Sub(start)
	d.m.handlerTime.Observe(took.Seconds())
	if t != nil && took >= d.opt.Lease {
		d.log.Warn("handler ran past the claim lease; a copy may have taken the key over and run beside it (does it honour its context?)",
			"key", key, "message_id", m.ID, "took", took, "lease", d.opt.Lease)
	}

	sctx, scancel := context.WithTimeout(bg, settleTimeout)
	defer scancel()
	if err != nil {
		d.log.Debug("handler failed: key released, message nacked", "key", key, "message_id", m.ID, "err", err)
		if t != nil {
			if rerr := d.dd.Release(sctx, *t); rerr != nil {
				d.log.Warn("release after a failed handler; the key stays claimed until its lease ends",
					"key", key, "message_id", m.ID, "err", rerr)
			}
		}
		return Retried
	}
	if t != nil {
		if cerr := d.dd.Commit(sctx, *t); cerr != nil {
			// The handler's work is done: acking is right. Until the lease
			// ends copies wait; after it, one may run the handler again.
			d.log.Warn("commit after a successful handler failed", "key", key, "message_id", m.ID, "err", cerr)
		}
	}
	d.m.latency.Observe(d.now().Sub(m.PublishTime).Seconds())
	return Emitted
}

// reject deals with a message that has no usable key.
func (d *Dedup) reject(ctx context.Context, m *pubsub.Message, reason error) Outcome {
	if d.opt.OnReject == nil {
		d.strikes.Hold(ctx, m.ID, conflictHold, maxRejectHold, func(n int) {
			d.log.Warn("message without a usable dedup key nacked; it comes back until it is removed (set OnReject, or a dead-letter policy on the subscription)",
				"message_id", m.ID, "deliveries", n, "reason", reason)
		})
		return Retried
	}
	if err := d.opt.OnReject(ctx, view(m), reason); err != nil {
		d.log.Warn("OnReject failed; message nacked", "message_id", m.ID, "reason", reason, "err", err)
		return Retried
	}
	return DeadLettered
}

// view is the message as the handler and callbacks see it: the same
// fields, but Ack and Nack do nothing (it has no ack handler), so only the
// wrapper settles the delivery.
func view(m *pubsub.Message) *pubsub.Message {
	return &pubsub.Message{
		ID: m.ID, Data: m.Data, Attributes: m.Attributes, PublishTime: m.PublishTime,
		DeliveryAttempt: m.DeliveryAttempt, OrderingKey: m.OrderingKey,
	}
}

// hold waits about d (jittered, so replicas do not retry in step) or
// until ctx is done.
func hold(ctx context.Context, d time.Duration) {
	_ = backoff.Sleep(ctx, d/2+rand.N(d/2+1))
}
