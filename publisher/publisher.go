// Package publisher is the producer's half of dedupflow's contract: every
// logical event gets a stable key, stamped into an attribute once, before the
// first publish attempt, and every retry of that event carries the same key.
// A retry that follows a lost response then reaches the dedup pipeline as a
// republished copy of a key it has seen, and is dropped, instead of as a new
// event. (Generating the key inside a retry loop is the classic way to
// defeat deduplication; this package makes that impossible.)
//
// It wraps a *pubsub.Publisher of cloud.google.com/go/pubsub/v2 and keeps its
// shape: Publish returns at once, the client batches many events into one
// request, and the returned Result's Get waits for the server:
//
//	p, err := publisher.New(client.Publisher("orders"), publisher.Options{IDAttribute: "event_id"})
//	r := p.Publish(ctx, publisher.Event{Key: "order-123", Data: body})
//	id, err := r.Get(ctx) // r.Key() is "order-123"
//
// Retries run inside Get: when an attempt fails with a retryable error, Get
// waits out a jittered exponential backoff and sends the same message again,
// up to Options.MaxAttempts attempts. So, as with pubsub, call Get on every
// Result: it is how failures surface, and here also how they are retried.
//
// The official client already retries transient errors itself, for up to
// PublishSettings.Timeout; it resends the same attributes, so its retries keep
// the key too. This package's retries come on top, for failures that outlast
// that timeout or that a client configured without retries reports.
package publisher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/google/uuid"

	"github.com/dedupflow/dedupflow/internal/backoff"
)

// DefaultIDAttribute is the id attribute, the attribute the key goes in,
// unless Options.IDAttribute says otherwise: "key", the name the tutorial's
// app and its Dataflow job use, and what dedupflow's publish, loadgen and
// up use by default. Give the pipeline the same --id-attribute.
const DefaultIDAttribute = "key"

// DefaultKeyAttribute is DefaultIDAttribute.
//
// Deprecated: use DefaultIDAttribute. Before the two names became one it
// was "event_id"; a pipeline that reads event_id needs Options.IDAttribute
// set to it.
const DefaultKeyAttribute = DefaultIDAttribute

// DefaultMaxAttempts bounds the attempts per event unless
// Options.MaxAttempts says otherwise.
const DefaultMaxAttempts = 5

// Options configure a Publisher. The zero value is usable.
type Options struct {
	// IDAttribute is the attribute holding the key (default
	// DefaultIDAttribute): the pipeline's --id-attribute, Beam's
	// withIdAttribute.
	IDAttribute string
	// KeyAttribute is IDAttribute's former name, read when IDAttribute is
	// empty.
	//
	// Deprecated: use IDAttribute.
	KeyAttribute string
	// TimestampAttribute, when set, gets the event time in milliseconds
	// since the Unix epoch, stamped once with the key: Event.Time, or the
	// time of Publish. A retry does not move it.
	TimestampAttribute string
	// NewKey makes the key of an event published without one (default: a
	// UUIDv7, which sorts by creation time).
	NewKey func() (string, error)
	// MaxAttempts bounds the attempts per event, the first included
	// (default 5).
	MaxAttempts int
	// Backoff is the pause between attempts; zero fields take
	// DefaultBackoff's.
	Backoff Backoff
	// Retryable decides whether a failed attempt is tried again (default
	// the package's Retryable).
	Retryable func(error) bool
	// Now is the clock for timestamps (default time.Now).
	Now func() time.Time
	// Sleep waits between attempts and returns early with ctx's error
	// (default: a timer). Tests replace it to run backoff without waiting.
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger gets one warning per retried attempt (default: discard).
	Logger *slog.Logger
}

// Validate checks the options, filling in defaults.
func (o *Options) Validate() error {
	switch {
	case o.IDAttribute == "" && o.KeyAttribute != "":
		o.IDAttribute = o.KeyAttribute
	case o.IDAttribute == "":
		o.IDAttribute = DefaultIDAttribute
	case o.KeyAttribute != "" && o.KeyAttribute != o.IDAttribute:
		return fmt.Errorf("id attribute %q and key attribute %q: set IDAttribute only", o.IDAttribute, o.KeyAttribute)
	}
	o.KeyAttribute = o.IDAttribute
	if err := checkName(o.IDAttribute); err != nil {
		return fmt.Errorf("id attribute: %w", err)
	}
	if o.TimestampAttribute != "" {
		if err := checkName(o.TimestampAttribute); err != nil {
			return fmt.Errorf("timestamp attribute: %w", err)
		}
		if o.TimestampAttribute == o.IDAttribute {
			return fmt.Errorf("timestamp attribute %q is also the id attribute", o.TimestampAttribute)
		}
	}
	if o.MaxAttempts == 0 {
		o.MaxAttempts = DefaultMaxAttempts
	}
	if o.MaxAttempts < 1 {
		return fmt.Errorf("max attempts %d must be at least 1", o.MaxAttempts)
	}
	o.Backoff = o.Backoff.withDefaults()
	if err := o.Backoff.validate(); err != nil {
		return err
	}
	if o.NewKey == nil {
		o.NewKey = newUUIDv7
	}
	if o.Retryable == nil {
		o.Retryable = Retryable
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Sleep == nil {
		o.Sleep = backoff.Sleep
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

func newUUIDv7() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("generate UUIDv7 key: %w", err)
	}
	return u.String(), nil
}

// Event is one logical event. All of its copies — retries, and any
// deliberate republishing with the same Key — are the same event to a dedup
// pipeline.
type Event struct {
	// Key identifies the event: a business key ("order-123") or empty for
	// a generated one. It may also come in Attributes under the key
	// attribute; giving two different keys is an error.
	Key         string
	Data        []byte
	Attributes  map[string]string
	Time        time.Time // event time for Options.TimestampAttribute; zero: now
	OrderingKey string    // needs the wrapped publisher's EnableMessageOrdering
}

// Publisher publishes events with stable keys. It is safe for concurrent
// use. It does not own the wrapped *pubsub.Publisher: stop that one when
// done, after the last Get.
type Publisher struct {
	pub *pubsub.Publisher
	o   Options
}

// New wraps p. Its PublishSettings (batching, timeout, flow control) apply
// to every attempt.
func New(p *pubsub.Publisher, o Options) (*Publisher, error) {
	if p == nil {
		return nil, errors.New("publisher: nil *pubsub.Publisher")
	}
	if err := o.Validate(); err != nil {
		return nil, fmt.Errorf("publisher options: %w", err)
	}
	return &Publisher{pub: p, o: o}, nil
}

// IDAttribute is the attribute the key is stamped into.
func (p *Publisher) IDAttribute() string { return p.o.IDAttribute }

// KeyAttribute is IDAttribute.
//
// Deprecated: use IDAttribute.
func (p *Publisher) KeyAttribute() string { return p.o.IDAttribute }

// Topic is the full name of the topic published to.
func (p *Publisher) Topic() string { return p.pub.String() }

// Publish fixes e's key and timestamp, checks the message against Pub/Sub's
// limits and sends the first attempt, returning at once. An invalid event
// is never sent: its Result's Get returns an error wrapping ErrInvalidEvent.
func (p *Publisher) Publish(ctx context.Context, e Event) *Result {
	r := &Result{p: p, done: make(chan struct{}), turn: make(chan struct{}, 1)}
	msg, key, err := p.prepare(e)
	r.key = key
	if err != nil {
		if key != "" {
			err = fmt.Errorf("event %s=%q: %w", p.o.IDAttribute, key, err)
		}
		r.finish("", err)
		return r
	}
	r.msg = msg
	r.send(ctx)
	return r
}

// prepare builds the message every attempt of e sends. This is the one
// place a key is made: once per event, before the first attempt.
func (p *Publisher) prepare(e Event) (pubsub.Message, string, error) {
	if len(e.Data) == 0 && len(e.Attributes) == 0 {
		return pubsub.Message{}, e.Key, invalid(ErrEmptyEvent, "give data or at least one attribute")
	}
	ka := p.o.IDAttribute
	key := e.Key
	if v, ok := e.Attributes[ka]; ok {
		switch {
		case key == "":
			key = v
		case v != key:
			return pubsub.Message{}, key, invalid(ErrKeyConflict, "Key %q but attribute %s=%q", key, ka, v)
		}
	}
	if key == "" {
		k, err := p.o.NewKey()
		if err != nil {
			return pubsub.Message{}, "", err
		}
		key = k
	}
	if err := checkKey(ka, key); err != nil {
		return pubsub.Message{}, "", err
	}
	attrs := make(map[string]string, len(e.Attributes)+2)
	maps.Copy(attrs, e.Attributes)
	attrs[ka] = key
	if ta := p.o.TimestampAttribute; ta != "" {
		_, given := attrs[ta]
		switch {
		case given && !e.Time.IsZero():
			return pubsub.Message{}, key, invalid(ErrTimestampConflict, "both Time and attribute %s are set", ta)
		case !e.Time.IsZero():
			attrs[ta] = strconv.FormatInt(e.Time.UnixMilli(), 10)
		case !given:
			attrs[ta] = strconv.FormatInt(p.o.Now().UnixMilli(), 10)
		}
	}
	if err := checkMessage(e.Data, attrs, e.OrderingKey); err != nil {
		return pubsub.Message{}, key, err
	}
	return pubsub.Message{Data: e.Data, Attributes: attrs, OrderingKey: e.OrderingKey}, key, nil
}

// Result is the outcome of publishing one event.
type Result struct {
	p   *Publisher
	key string
	msg pubsub.Message // the template every attempt copies

	// turn is held by the Get that is driving attempts; a channel rather
	// than a mutex so a waiting Get can give up when its context ends.
	turn     chan struct{}
	inner    *pubsub.PublishResult // the attempt in flight; nil between attempts
	attempts atomic.Int32          // written by the holder of turn only
	pause    time.Duration         // before the next attempt, when inner is nil

	done chan struct{} // closed when id and err are final
	id   string
	err  error
}

// Key is the event's key, stamped on every attempt. It is known at once,
// before anything is sent; empty only if Get reports that no key could be
// made.
func (r *Result) Key() string { return r.key }

// Attempts is the number of attempts sent so far.
func (r *Result) Attempts() int { return int(r.attempts.Load()) }

// Ready is closed once Get's answer is final. Retries run only inside Get,
// so a failed attempt leaves Ready open until Get is called.
func (r *Result) Ready() <-chan struct{} { return r.done }

// Get waits until the event is published and returns the message ID of
// the attempt that succeeded, retrying retryable failures with backoff. An
// earlier attempt may have been stored too, under another message ID whose
// response was lost: it carries the same key.
//
// If ctx ends first, Get returns ctx's error and the event stays pending:
// an attempt in flight goes on, and a later Get takes over from there.
func (r *Result) Get(ctx context.Context) (string, error) {
	select {
	case <-r.done:
		return r.id, r.err
	default:
	}
	select {
	case r.turn <- struct{}{}:
	case <-r.done:
		return r.id, r.err
	case <-ctx.Done():
		return "", r.interrupted(ctx.Err())
	}
	defer func() { <-r.turn }()
	for {
		select {
		case <-r.done: // another Get finished while this one waited its turn
			return r.id, r.err
		default:
		}
		if r.inner == nil {
			if err := r.p.o.Sleep(ctx, r.pause); err != nil {
				return "", r.interrupted(err)
			}
			r.send(ctx)
		}
		id, err := r.inner.Get(ctx)
		if err != nil && !isReady(r.inner) {
			return "", r.interrupted(err)
		}
		r.inner = nil
		switch {
		case err == nil:
			r.finish(id, nil)
		case !r.p.o.Retryable(err):
			r.finish("", r.failure(err, false))
		case r.Attempts() >= r.p.o.MaxAttempts:
			r.finish("", r.failure(err, true))
		default:
			r.pause = jitter(r.p.o.Backoff.Pause(r.Attempts()))
			r.p.o.Logger.Warn("publish attempt failed; retrying with the same key",
				"topic", r.p.pub.String(), "id_attribute", r.p.o.IDAttribute, "key", r.key,
				"attempt", r.Attempts(), "max_attempts", r.p.o.MaxAttempts,
				"backoff", r.pause, "err", err)
		}
	}
}

func isReady(r *pubsub.PublishResult) bool {
	select {
	case <-r.Ready():
		return true
	default:
		return false
	}
}

// send starts the next attempt with a fresh copy of the message: the
// client may add attributes to the map it is given (trace context), and
// each attempt must carry exactly the stamped ones.
func (r *Result) send(ctx context.Context) {
	if r.Attempts() > 0 && r.msg.OrderingKey != "" {
		// The client pauses an ordering key after a failure until told to
		// resume; without this every retry would fail at once.
		r.p.pub.ResumePublish(r.msg.OrderingKey)
	}
	m := r.msg
	m.Attributes = maps.Clone(r.msg.Attributes)
	r.inner = r.p.pub.Publish(ctx, &m)
	r.attempts.Add(1)
}

func (r *Result) failure(err error, gaveUp bool) error {
	return &PublishError{Key: r.key, IDAttribute: r.p.o.IDAttribute, KeyAttribute: r.p.o.IDAttribute, Topic: r.p.pub.String(),
		Attempts: r.Attempts(), GaveUp: gaveUp, Err: err}
}

func (r *Result) interrupted(err error) error {
	return fmt.Errorf("wait for event %s=%q after %d attempts: %w", r.p.o.IDAttribute, r.key, r.Attempts(), err)
}

func (r *Result) finish(id string, err error) {
	r.id, r.err = id, err
	close(r.done)
}
