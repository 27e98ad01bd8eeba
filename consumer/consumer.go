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

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/gate"
	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/outcome"
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
	// KeyFrom says where the key is, as the pipeline's --key-from:
	// dedup.KeyFromAttribute (IDAttribute, the default), dedup.KeyFromJSON
	// (the field at KeyPath of a JSON payload) or dedup.KeyFromHash (the
	// payload's SHA-256). A payload without the key follows MissingID.
	KeyFrom dedup.KeyFrom
	// KeyPath is the gjson path of the key field, for dedup.KeyFromJSON.
	KeyPath string

	// TimestampAttribute holds each message's event time (milliseconds
	// since the epoch or RFC 3339); empty means the publish time. A
	// message whose attribute is missing or malformed goes to OnReject.
	TimestampAttribute string
	// TimeDomain is the horizon's clock: dedup.ProcessingTime (default)
	// or dedup.EventTime, where a key expires when the watermark passes
	// its event time plus the horizon (see dedup.EventTime).
	TimeDomain dedup.TimeDomain
	// AllowedLateness is how far the event-time watermark trails the
	// highest event time seen.
	AllowedLateness time.Duration
	// Late is what happens, in event time, to a message too late to
	// judge: dedup.LatePass (default) runs the handler without dedup,
	// dedup.LateDeadLetter hands it to OnReject.
	Late dedup.Late

	// Horizon is how long a handled key is remembered, from first sight
	// (default dedup.DefaultHorizon, at least dedup.MinHorizon). A copy
	// that arrives later runs the handler again: the horizon protects
	// against near-term republishing; it is not an idempotency store.
	Horizon time.Duration
	// HorizonMode is dedup.Fixed (default: a key lives Horizon from first
	// sight) or dedup.Sliding (each caught copy keeps its key another
	// Horizon).
	HorizonMode dedup.HorizonMode
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
	// dedupflow_handler_seconds. For several Dedups in one process, wrap
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

// validate checks o and fills defaults.
func (o *Options) validate() error {
	for _, a := range []struct{ name, v string }{
		{"IDAttribute", o.IDAttribute}, {"ProducerAttribute", o.ProducerAttribute}, {"TimestampAttribute", o.TimestampAttribute},
	} {
		if a.v == "" {
			continue
		}
		if err := limits.AttributeKey(a.v); err != nil {
			return invalid("%s: %w", a.name, err)
		}
	}
	switch o.KeyFrom {
	case dedup.KeyFromAttribute:
		if o.KeyPath != "" {
			return invalid("KeyPath %q needs KeyFrom dedup.KeyFromJSON", o.KeyPath)
		}
	case dedup.KeyFromJSON:
		if o.KeyPath == "" {
			return invalid("KeyFrom dedup.KeyFromJSON needs a KeyPath (a gjson path such as order.id)")
		}
	case dedup.KeyFromHash:
	default:
		return invalid("unknown KeyFrom %d", o.KeyFrom)
	}
	switch o.MissingID {
	case dedup.Fallback, dedup.Pass, dedup.Reject:
	default:
		return invalid("unknown MissingID policy %d: want dedup.Fallback, dedup.Pass or dedup.Reject", o.MissingID)
	}
	if o.IDAttribute == "" && o.KeyFrom == dedup.KeyFromAttribute {
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
	if err := opt.validate(); err != nil {
		return nil, err
	}
	dd, err := dedup.New(store, dedup.Options{Horizon: opt.Horizon, Lease: opt.Lease, Now: opt.Now, LocalWait: opt.Lease,
		Domain: opt.TimeDomain, AllowedLateness: opt.AllowedLateness, Mode: opt.HorizonMode})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidOptions, err)
	}
	d := &Dedup{opt: opt, f: f}
	gc := gate.Config{
		Rule:               dedup.Rule{IDAttribute: opt.IDAttribute, Missing: opt.MissingID, From: opt.KeyFrom, Path: opt.KeyPath},
		TimestampAttribute: opt.TimestampAttribute, ProducerAttribute: opt.ProducerAttribute, Late: opt.Late,
		Deduper: dd, Work: gate.Work{Name: "handler", Do: d.run},
		RejectName: "OnReject", Hint: "set OnReject, or a dead-letter policy on the subscription",
		Logger: opt.Logger, Now: opt.Now,
	}
	if opt.OnReject != nil {
		gc.Reject = func(ctx context.Context, m *pubsub.Message, reason error) error {
			return opt.OnReject(ctx, view(m), reason)
		}
	}
	if opt.OnDuplicate != nil {
		gc.OnDuplicate = func(ctx context.Context, m *pubsub.Message, k dedup.Kind) { opt.OnDuplicate(ctx, view(m), k) }
	}
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
