package consumer

import (
	"context"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/gate"
)

// Handle is the callback for Subscriber.Receive: it runs the handler
// unless the key was already handled within the horizon, then acks or
// nacks m. It runs the decision path the pipeline runs (internal/gate);
// the handler is its work step.
//
//   - The handler returned nil: commit the key, ack.
//   - It returned an error: release the key, nack; the redelivery runs it
//     again. An error wrapping ErrPermanent goes to OnReject instead.
//   - A duplicate (the key was handled within the horizon): OnDuplicate,
//     then ack; the handler is not called.
//   - The key is being handled right now, here or by a replica sharing the
//     store: a copy in this process waits for that handler (up to the
//     lease); one in another replica is held briefly and nacked. It comes
//     back and is then a duplicate (or, if that handler failed, runs).
//   - The store is unreachable: hold the message while the store backs off
//     (100ms doubling to 5s, jittered), then nack. Later messages wait
//     out the same pause before they try, so a store outage is a trickle
//     of probes, not a hot loop of redeliveries.
//   - The store refused for good (dedup.ErrFatal: a refused password, a
//     missing permission): every message is nacked from then on, Ready is
//     false and Err returns the cause; Receive (the method) returns it.
//   - No usable key or event time (see Options.OnReject): OnReject, or
//     hold and nack.
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
	settled := false
	defer func() {
		if !settled {
			// Unwinding from a panic (or Goexit) in the handler or a
			// callback: nack, so the message is not held until its ack
			// deadline if the process survives. If it does not, the nack
			// may not be sent; the deadline brings the message back.
			m.Nack()
		}
	}()
	r := d.gate.Pass(ctx, m)
	settled = true
	r.Settle(ctx, m)
}

// run is the gate's work for one message: the handler, with the key in its
// context and bounded by HandlerTimeout.
func (d *Dedup) run(ctx context.Context, it *gate.Item) error {
	hctx := ctx
	if it.Key != "" {
		hctx = context.WithValue(ctx, keyCtx{}, it.Key)
	}
	hctx, cancel := context.WithTimeout(hctx, d.opt.HandlerTimeout)
	defer cancel()
	start := d.opt.Now()
	err := d.f(hctx, view(it.In))
	if took := d.opt.Now().Sub(start); it.Key != "" && took >= d.opt.Lease {
		d.opt.Logger.Warn("handler ran past the claim lease; a copy may have taken the key over and run beside it (does it honour its context?)",
			"key", it.Key, "message_id", it.In.ID, "took", took, "lease", d.opt.Lease)
	}
	return err
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

// Receiver is a *pubsub.Subscriber.
type Receiver interface {
	Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error
}

// Receive runs in.Receive with Handle until ctx is done, or until an error
// that retrying cannot fix stops the wrapper: it then returns that error,
// so a service that exits on it is restarted (or alerted on) instead of
// nacking forever. While Pub/Sub is unreachable the official client's
// Receive does not return after ctx ends; pass
// pubsubio.StopWithin(sub, grace) as in to bound the stop.
func (d *Dedup) Receive(ctx context.Context, in Receiver) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-d.gate.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	err := in.Receive(ctx, d.Handle)
	d.gate.Drain() // the commits still retried
	if ferr := d.gate.Err(); ferr != nil {
		return ferr
	}
	return err
}
