// Package consumer gives a service that reads Pub/Sub itself, with
// Subscriber.Receive, the dedup pipeline's guarantees in-process: a wrapper
// around the service's handler drops redeliveries and republished copies
// within the horizon, and never drops a message whose handler failed.
//
//	h, err := consumer.Handler(store, consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}},
//		func(ctx context.Context, m *pubsub.Message) error {
//			return process(ctx, m.Data) // nil: done; an error: it comes back
//		})
//	if err != nil {
//		return err
//	}
//	return sub.Receive(ctx, h)
//
// Per message, as the pipeline does: derive the key (dedup.Policy); claim it
// (dedup.Deduper); run the handler; commit the key only if the handler
// returned nil; ack. A handler error releases the key and nacks, so the
// redelivery runs the handler again. This is the order that matters:
// Watermill's deduplicator middleware records the key before the handler
// runs, so a failed handler's redelivery is taken for a duplicate and lost.
//
// The store is any dedup.Store: store/mem in one process, store/redis for
// replicas that share a subscription (they then agree on which keys were
// handled), store/disk to survive restarts.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/gate"
	"github.com/dedupflow/dedupflow/outcome"
)

// HandlerFunc handles one message. Its return value decides the message's
// fate: nil commits the key and acks; an error releases the key and nacks,
// so Pub/Sub delivers it again and the handler runs again. An error that
// wraps ErrPermanent goes to OnReject instead, and one that wraps
// dedup.ErrFatal (a sink's ErrClosed is one) stops Receive with it.
//
// m is a copy of the delivered message whose Ack and Nack do nothing: the
// wrapper acks or nacks after it knows the outcome, and a stray m.Ack() in a
// handler that then fails must not lose the message. ctx is done when
// Receive is shutting down or the handler ran for Options.HandlerTimeout;
// KeyFromContext(ctx) is the message's dedup key.
type HandlerFunc func(ctx context.Context, m *pubsub.Message) error

// Options configure a Dedup. The zero value dedups redeliveries only (the
// key is the message ID) over a 10 minute horizon.
type Options struct {
	// Policy is how messages are deduped, as in the pipeline: the key
	// (IDAttribute names the attribute in which publishers stamp a stable
	// key, once, before the first attempt; empty keys by message ID, which
	// catches redeliveries only), the event time, the horizon and the
	// lease (see dedup.Policy). A message without a usable key or
	// event time, and one too late to judge under dedup.LateDeadLetter,
	// goes to OnReject; under dedup.Pass and dedup.LatePass the handler
	// runs without dedup. The lease keeps other copies away while the
	// handler runs.
	dedup.Policy

	// HandlerTimeout bounds one handler call through its context (default
	// Lease/2). It must be shorter than Lease: a handler that outlives the
	// lease may run at the same time as a copy that took the key over.
	HandlerTimeout time.Duration

	// OnDuplicate, if set, sees each duplicate before it is acked, with
	// its kind: dedup.Redelivery (the same message again, e.g. after a
	// lost ack) or dedup.Republish (a new message with the same key).
	OnDuplicate func(ctx context.Context, m *pubsub.Message, kind dedup.Kind)
	// OnReject, if set, receives the messages that cannot be used — the
	// key is missing under dedup.Reject, too long, not UTF-8, or in the
	// message-ID namespace; the event time is missing or malformed; the
	// handler returned an error wrapping ErrPermanent — since a consumer
	// has no dead-letter topic of its own. nil
	// from it acks the message (the callback took care of it, e.g. wrote it
	// aside); an error nacks it. Unset, such messages are nacked and logged,
	// never acked: give the subscription a dead-letter policy to move them
	// aside after a few attempts.
	OnReject func(ctx context.Context, m *pubsub.Message, reason error) error

	// VerifyToken, for PushHandler, checks the bearer token of each push
	// request (an OIDC ID token: its signature, audience and issuer, e.g.
	// with google.golang.org/api/idtoken.Validate); an error answers 401.
	// Nil verifies nothing.
	VerifyToken func(ctx context.Context, token string) error

	// Logger receives warnings (store unreachable, a commit that failed);
	// nil discards.
	Logger *slog.Logger
	// Now is the clock for claims, horizons and backoff; nil is time.Now.
	Now func() time.Time
	// Registerer, if set, gets the pipeline's metrics
	// (dedupflow_messages_total{outcome}, dedupflow_received_total,
	// dedupflow_missing_id_total{producer}, latency histograms) and
	// dedupflow_handler_batch_seconds. For several Dedups in one process, wrap
	// it with prometheus.WrapRegistererWith and a distinguishing label.
	Registerer prometheus.Registerer
}

// ErrInvalidOptions is wrapped by every error New returns for bad Options.
var ErrInvalidOptions = errors.New("invalid consumer options")

// ErrPermanent, wrapped in a handler's error, says retrying cannot help
// (the message is malformed for this service): the message goes to
// OnReject instead of coming back.
var ErrPermanent = dedup.ErrPermanent

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
}

// Validate checks o and fills its defaults: the policy's (in
// dedup.Policy.Validate, as for the pipeline) and the handler timeout's.
// Every error it returns wraps ErrInvalidOptions.
func (o *Options) Validate() error {
	if err := o.Policy.Validate(); err != nil {
		return invalid("%w", err)
	}
	if o.HandlerTimeout == 0 {
		o.HandlerTimeout = o.Lease / 2
	}
	if o.HandlerTimeout < 0 {
		return invalid("handler timeout %v must be positive", o.HandlerTimeout)
	}
	if o.HandlerTimeout >= o.Lease {
		return invalid("handler timeout %v must be shorter than the lease %v, or a slow handler could run beside a copy that took its key over",
			o.HandlerTimeout, o.Lease)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Dedup wraps one handler. Its Handle method is the callback for
// Subscriber.Receive; it is safe for concurrent use, as Receive requires.
type Dedup struct {
	opt  Options
	f    HandlerFunc
	gate *gate.Gate
}

// New validates opt and returns a Dedup over store under which f succeeds
// at most once per key within the horizon; a failed call does not count,
// and its message comes back. Two narrow exceptions, as in the pipeline: a
// commit that fails after f succeeded (the store went down in between)
// leaves the key claimed until its lease ends, after which a copy runs f
// again; and a handler that ignores its context past the lease may run
// beside a copy that took the key over.
func New(store dedup.Store, opt Options, f HandlerFunc) (*Dedup, error) {
	if store == nil {
		return nil, invalid("nil store: use store/mem for one process, store/redis for replicas")
	}
	if f == nil {
		return nil, invalid("nil handler")
	}
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	d := &Dedup{opt: opt, f: f}
	gc := gate.Config{
		Policy: opt.Policy, Store: store, Work: gate.Work{Name: "handler", Do: gate.Each(d.run)},
		RejectName: "OnReject", Hint: "set OnReject, or a dead-letter policy on the subscription",
		Logger: opt.Logger, Now: opt.Now,
	}
	if opt.OnReject != nil {
		gc.Reject = func(ctx context.Context, ms []*pubsub.Message, reasons, errs []error) {
			for i, m := range ms {
				errs[i] = opt.OnReject(ctx, view(m), reasons[i])
			}
		}
	}
	if opt.OnDuplicate != nil {
		gc.OnDuplicate = func(ctx context.Context, m *pubsub.Message, k dedup.Kind) { opt.OnDuplicate(ctx, view(m), k) }
	}
	var err error
	if d.gate, err = gate.New(gc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	if opt.Registerer != nil {
		if err := opt.Registerer.Register(d.gate.Collector()); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return d, nil
}

// Handler is New for the common case: it returns the callback to pass to
// Subscriber.Receive.
func Handler(store dedup.Store, opt Options, f HandlerFunc) (func(context.Context, *pubsub.Message), error) {
	d, err := New(store, opt, f)
	if err != nil {
		return nil, err
	}
	return d.Handle, nil
}

// Counts is a snapshot of a Dedup's counters. The outcomes add up to
// Received once every message in flight is settled.
type Counts = outcome.Counts

// Counts returns the counters so far.
func (d *Dedup) Counts() Counts { return d.gate.Counts() }

// Ready reports whether the store answered the last claim (and OnReject
// its last call), and nothing fatal happened; use it for a readiness
// probe. While it is false, messages are held back and nacked.
func (d *Dedup) Ready() bool { return d.gate.Ready() }

// Err is the error that retrying cannot fix which stopped the wrapper
// (every message is nacked from then on), or nil.
func (d *Dedup) Err() error { return d.gate.Err() }

type keyCtx struct{}

// KeyFromContext returns the dedup key of the message a handler is
// running for. A handler that writes somewhere can store it beside the
// write (an upsert keyed on it), so the one copy a crash between the write
// and the commit can let through is a no-op there too.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok
}
