// Package consumer gives a service that reads Pub/Sub itself, with
// Subscriber.Receive, the dedup pipeline's guarantees in-process: a wrapper
// around the service's handler drops redeliveries and republished copies
// within the horizon, and never drops a message whose handler failed.
//
//	h, err := consumer.Handler(store, consumer.Options{IDAttribute: "event_id"},
//		func(ctx context.Context, m *pubsub.Message) error {
//			return process(ctx, m.Data) // nil: done; an error: it comes back
//		})
//	if err != nil {
//		return err
//	}
//	return sub.Receive(ctx, h)
//
// Per message, as the pipeline does: derive the key (dedup.Rule); claim it
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
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
)

// HandlerFunc handles one message. Its return value decides the message's
// fate: nil commits the key and acks; an error releases the key and nacks,
// so Pub/Sub delivers it again and the handler runs again.
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
	// IDAttribute names the attribute in which publishers stamp a stable
	// key, once, before the first attempt; copies that carry the same key
	// are republishes and are dropped too. Empty: the message ID is the
	// key, which catches redeliveries only.
	IDAttribute string
	// MissingID is what happens to a message without IDAttribute (or with
	// it empty): dedup.Fallback (default) keys it by its message ID;
	// dedup.Pass runs the handler without dedup; dedup.Reject does not run
	// the handler and hands the message to OnReject.
	MissingID dedup.Missing
	// ProducerAttribute labels dedupflow_missing_id_total, so the one
	// producer in a fleet that forgets the key can be found.
	ProducerAttribute string

	// Horizon is how long a handled key is remembered, from first sight
	// (default dedup.DefaultHorizon, at least dedup.MinHorizon). A copy
	// that arrives later runs the handler again: the horizon protects
	// against near-term republishing; it is not an idempotency store.
	Horizon time.Duration
	// Lease is how long a claimed key keeps other copies away while the
	// handler runs (default dedup.DefaultLease). A claimant that dies is
	// taken over after it.
	Lease time.Duration
	// HandlerTimeout bounds one handler call through its context (default
	// Lease/2). It must be shorter than Lease: a handler that outlives the
	// lease may run at the same time as a copy that took the key over.
	HandlerTimeout time.Duration

	// OnDuplicate, if set, sees each duplicate before it is acked, with
	// its kind: dedup.Redelivery (the same message again, e.g. after a
	// lost ack) or dedup.Republish (a new message with the same key).
	OnDuplicate func(ctx context.Context, m *pubsub.Message, kind dedup.Kind)
	// OnReject, if set, receives the messages whose key cannot be used —
	// the id attribute is missing under dedup.Reject, too long, or not
	// UTF-8 — since a consumer has no dead-letter topic of its own. nil
	// from it acks the message (the callback took care of it, e.g. wrote it
	// aside); an error nacks it. Unset, such messages are nacked and logged,
	// never acked: give the subscription a dead-letter policy to move them
	// aside after a few attempts.
	OnReject func(ctx context.Context, m *pubsub.Message, reason error) error

	// Logger receives warnings (store unreachable, a commit that failed);
	// nil discards.
	Logger *slog.Logger
	// Now is the clock for claims, horizons and backoff; nil is time.Now.
	Now func() time.Time
	// Registerer, if set, gets the pipeline's metrics
	// (dedupflow_messages_total{outcome}, dedupflow_received_total,
	// dedupflow_missing_id_total{producer}, latency histograms) and
	// dedupflow_handler_seconds. For several Dedups in one process, wrap
	// it with prometheus.WrapRegistererWith and a distinguishing label.
	Registerer prometheus.Registerer
}

// ErrInvalidOptions is wrapped by every error New returns for bad Options.
var ErrInvalidOptions = errors.New("invalid consumer options")

// maxAttributeKey is the service's limit on attribute key length.
const maxAttributeKey = 256

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidOptions}, args...)...)
}

// validate checks o and fills defaults.
func (o *Options) validate() error {
	for _, a := range []struct{ name, v string }{{"IDAttribute", o.IDAttribute}, {"ProducerAttribute", o.ProducerAttribute}} {
		if len(a.v) > maxAttributeKey {
			return invalid("%s is %d bytes; Pub/Sub attribute keys are at most %d", a.name, len(a.v), maxAttributeKey)
		}
		if !utf8.ValidString(a.v) {
			return invalid("%s %q is not valid UTF-8", a.name, a.v)
		}
	}
	switch o.MissingID {
	case dedup.Fallback, dedup.Pass, dedup.Reject:
	default:
		return invalid("unknown MissingID policy %d: want dedup.Fallback, dedup.Pass or dedup.Reject", o.MissingID)
	}
	if o.IDAttribute == "" {
		// Both settings only mean something when a message can lack the
		// id attribute; accepting them silently would hide a typo'd config.
		if o.MissingID != dedup.Fallback {
			return invalid("MissingID %s needs an IDAttribute: without one every message is keyed by its message ID", o.MissingID)
		}
		if o.ProducerAttribute != "" {
			return invalid("ProducerAttribute %q needs an IDAttribute: it labels messages that lack it", o.ProducerAttribute)
		}
	}
	if o.Horizon == 0 {
		o.Horizon = dedup.DefaultHorizon
	}
	if o.Horizon < dedup.MinHorizon {
		return invalid("horizon %v is below the minimum of %v", o.Horizon, dedup.MinHorizon)
	}
	if o.Lease == 0 {
		o.Lease = dedup.DefaultLease
	}
	if o.Lease < 0 {
		return invalid("lease %v must be positive", o.Lease)
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
	opt   Options
	rule  dedup.Rule
	dd    *dedup.Deduper
	f     HandlerFunc
	log   *slog.Logger
	now   func() time.Time
	m     *metrics
	store *backoff.Tracker

	strikes backoff.Strikes // rejected messages nacked, without OnReject
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
	if err := opt.validate(); err != nil {
		return nil, err
	}
	dd, err := dedup.New(store, dedup.Options{Horizon: opt.Horizon, Lease: opt.Lease, Now: opt.Now, LocalWait: opt.Lease})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	d := &Dedup{
		opt:  opt,
		rule: dedup.Rule{IDAttribute: opt.IDAttribute, Missing: opt.MissingID},
		dd:   dd, f: f, log: opt.Logger, now: opt.Now,
		m: newMetrics(),
	}
	d.store = backoff.NewTracker("dedup store", "holding messages, nacking and backing off", d.log, d.now)
	if opt.Registerer != nil {
		if err := opt.Registerer.Register(d.m); err != nil {
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

// Counts returns the counters so far.
func (d *Dedup) Counts() Counts { return d.m.Snapshot() }

// Ready reports whether the store answered the last claim; use it for a
// readiness probe. While it is false, messages are held back and nacked.
func (d *Dedup) Ready() bool { return d.store.Ready() }

type keyCtx struct{}

// KeyFromContext returns the dedup key of the message a handler is
// running for. A handler that writes somewhere can store it beside the
// write (an upsert keyed on it), so the one copy a crash between the write
// and the commit can let through is a no-op there too.
func KeyFromContext(ctx context.Context) (string, bool) {
	k, ok := ctx.Value(keyCtx{}).(string)
	return k, ok
}
