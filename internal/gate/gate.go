// Package gate is the one decision path every dedupflow front end runs for
// each message: the pipeline (its work is a sink write), the consumer's
// Receive wrapper (its work is the user's handler) and the push handler.
//
// Per message: take the event time, derive the key (counting a missing
// one), wait out a store outage, claim the key, map the verdict to an
// outcome, run the front end's work under the claim, then commit the key
// (after success) or release it (after failure, or a panic), and pause
// before a nack that would bring the message straight back. A message that
// cannot be used goes to the front end's Reject (a dead-letter topic,
// OnReject) or, without one, is held back longer at each delivery and
// nacked: never acked and dropped. An error that retrying cannot fix
// (dedup.ErrFatal) stops the gate: everything after it is nacked, Ready is
// false, and Done is closed so the front end can stop receiving.
package gate

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/outcome"
)

// Item is a message on its way through the gate, as the work sees it.
type Item struct {
	In *pubsub.Message
	// Key is the dedup key; empty for a message passed without dedup.
	Key    string
	Source dedup.Source
	// EventTime is the timestamp attribute's time, else the publish time.
	EventTime time.Time
	// LateDuplicate: the audit filter saw the key beyond the horizon.
	LateDuplicate bool

	// hash is Key as the store and the audit hold it (dedup.KeyOf), and
	// auditAt the time the audit files it under (set with an audit only).
	hash    dedup.Key
	auditAt time.Time
}

// Work is the front end's step: write to a sink, call a handler.
type Work struct {
	// Name names the step in logs and in the dedupflow_NAME_seconds
	// histogram: "sink", "handler".
	Name string
	// Do does the work; nil means done. An error wrapping
	// dedup.ErrPermanent sends the message to Reject; one wrapping
	// dedup.ErrFatal stops the gate; any other brings the message back.
	Do func(ctx context.Context, it *Item) error
	// DoBatch, if set, does the work of many items at once (one sink
	// write) for PassBatch: errs[i] is its[i]'s result, read as Do's.
	// Nil: PassBatch calls Do for every item at once.
	DoBatch func(ctx context.Context, its []*Item, errs []error)
	// Dependency says a failure means the step's dependency is down (a
	// sink): the gate then backs off and reports not ready. Otherwise a
	// failure is the message's own (a handler's error).
	Dependency bool
	// Outlive says the work and Reject must finish even when the caller's
	// context ends (a sink write: finishing it and acking beats leaving
	// its key pending until the lease ends). They then get a context that
	// a shutdown does not cancel and that ends before the claim's lease;
	// otherwise the caller's.
	Outlive bool
}

// Config configures a Gate.
type Config struct {
	// Policy is how messages are deduped: the key, the event time, the
	// horizon and the lease. The gate's Deduper is made from it.
	dedup.Policy
	// Store holds the claimed and written keys.
	Store dedup.Store
	// Shadow makes and counts every decision but does the work for every
	// message, to measure duplicate rates before turning dedup on.
	Shadow bool
	// Audit, if set, remembers emitted keys far past the horizon to mark
	// late duplicates.
	Audit *audit.Filter

	Work Work
	// Reject takes a message that cannot be used (no usable key or time,
	// a permanent work error) aside; nil from it acks the message. Nil
	// Reject: such a message is held back and nacked, logged with Hint
	// (how to move such messages aside).
	Reject func(ctx context.Context, in *pubsub.Message, reason error) error
	// RejectName names Reject's destination in logs ("dead-letter topic").
	RejectName string
	Hint       string
	// OnDuplicate, if set, sees each caught duplicate before its ack.
	OnDuplicate func(ctx context.Context, in *pubsub.Message, kind dedup.Kind)
	// SettleTimeout bounds a commit or release; default half the lease.
	SettleTimeout time.Duration
	// HorizonKeys reports the store's live keys for the gauge, if it can.
	HorizonKeys func() int

	Logger *slog.Logger
	Now    func() time.Time
}

// Gate runs the decision path. It is safe for concurrent use.
type Gate struct {
	cfg  Config
	dd   *dedup.Deduper
	log  *slog.Logger
	now  func() time.Time
	m    *metrics
	by   *deadlines
	hold backoff.Strikes // unusable messages without Reject

	storeHealth  *backoff.Tracker
	workHealth   *backoff.Tracker // nil unless the work is a dependency
	rejectHealth *backoff.Tracker

	fatalOnce sync.Once
	fatal     error
	done      chan struct{}
}

// New validates cfg and returns a Gate.
func New(cfg Config) (*Gate, error) {
	if cfg.Store == nil || cfg.Work.Do == nil || cfg.Work.Name == "" {
		return nil, errors.New("gate needs a store and named work")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = cfg.Lease / 2
	}
	// A copy of a key this process is writing waits for that write (it
	// ends within a lease) rather than being nacked and redelivered.
	dd, err := dedup.New(cfg.Store, dedup.Options{Policy: cfg.Policy, Now: cfg.Now, LocalWait: cfg.Lease})
	if err != nil {
		return nil, err
	}
	if cfg.RejectName == "" {
		cfg.RejectName = "dead-letter destination"
	}
	g := &Gate{cfg: cfg, dd: dd, log: cfg.Logger, now: cfg.Now, by: newDeadlines(cfg.SettleTimeout),
		done: make(chan struct{})}
	var auditHorizon time.Duration
	if cfg.Audit != nil {
		auditHorizon = cfg.Audit.Horizon()
	}
	g.m = newMetrics(cfg.Work.Name, g.dd.Horizon(), auditHorizon)
	g.m.horizon = cfg.HorizonKeys
	g.m.horizonS, g.m.mode, g.m.started = g.dd.Horizon().Seconds(), g.dd.Mode().String(), g.now()
	if g.dd.Domain() == dedup.EventTime {
		g.m.watermark = g.dd.Watermark
	}
	if cfg.Audit != nil {
		g.m.audit = cfg.Audit.Stats
	}
	g.storeHealth = backoff.NewTracker("dedup store", "holding messages, nacking and backing off", g.log, g.now)
	if cfg.Work.Dependency {
		g.workHealth = backoff.NewTracker(cfg.Work.Name, "nacking and backing off", g.log, g.now)
	}
	g.rejectHealth = backoff.NewTracker(cfg.RejectName, "nacking unusable messages and backing off", g.log, g.now)
	g.m.deps = []dependency{{"store", g.storeHealth}}
	if g.workHealth != nil {
		g.m.deps = append(g.m.deps, dependency{cfg.Work.Name, g.workHealth})
	}
	if cfg.Reject != nil {
		g.m.deps = append(g.m.deps, dependency{"dead_letter", g.rejectHealth})
	}
	return g, nil
}

// Collector is the gate's metrics, to register once.
func (g *Gate) Collector() prometheus.Collector { return g.m }

// Counts returns the counters so far.
func (g *Gate) Counts() outcome.Counts { return g.m.Snapshot() }

// Ready reports whether the store, the work's dependency and the reject
// destination answered last time, and nothing fatal happened.
func (g *Gate) Ready() bool {
	return g.Err() == nil && g.storeHealth.Ready() && g.rejectHealth.Ready() &&
		(g.workHealth == nil || g.workHealth.Ready())
}

// Done is closed when the gate stopped on a fatal error.
func (g *Gate) Done() <-chan struct{} { return g.done }

// Err is the fatal error that stopped the gate, or nil.
func (g *Gate) Err() error {
	select {
	case <-g.done:
		return g.fatal
	default:
		return nil
	}
}

// workContext is the context the work and Reject run under: the caller's,
// or with Work.Outlive one that ends SettleTimeout from now (give or take
// a tenth) and is not canceled by a shutdown.
func (g *Gate) workContext(ctx context.Context) context.Context {
	if g.cfg.Work.Outlive {
		return g.by.ctx()
	}
	return ctx
}

// stop records the first fatal error and closes Done.
func (g *Gate) stop(err error) {
	g.fatalOnce.Do(func() {
		g.fatal = err
		g.log.Error("stopping: an error that retrying cannot fix; messages in flight are nacked", "err", err)
		close(g.done)
	})
}

// Pass runs m through the gate and returns its outcome; the caller acks
// it if the outcome is acked, and nacks it otherwise.
func (g *Gate) Pass(ctx context.Context, in *pubsub.Message) (o outcome.Outcome) {
	g.m.Received()
	settled := false
	defer func() {
		if !settled { // unwinding from a panic in the work or a callback
			o = outcome.Retried
		}
		if a := g.cfg.ProducerAttribute; a != "" {
			g.m.CountFrom(o, in.Attributes[a])
		} else {
			g.m.Count(o)
		}
	}()
	o = g.pass(ctx, in)
	settled = true
	return o
}

// pass runs one message: its key, then the decision. The two are apart so
// that the key's parsing and hashing leave no frame on the stack while the
// claim and the work run: the client runs each message on a new goroutine,
// and a deeper path makes more of them grow (and copy) their stack.
func (g *Gate) pass(ctx context.Context, in *pubsub.Message) outcome.Outcome {
	if g.Err() != nil {
		return outcome.Retried
	}
	it, o := g.keyed(ctx, in)
	switch {
	case it == nil:
		return o
	case it.Source == dedup.SourceNone:
		return g.work(ctx, it, nil, false, time.Time{})
	}
	return g.decide(ctx, it)
}

// keyed takes the message's event time and key. A message without them is
// settled here (moved aside), and keyed returns nil and its outcome; one to
// work on without dedup comes back with Source SourceNone.
func (g *Gate) keyed(ctx context.Context, in *pubsub.Message) (*Item, outcome.Outcome) {
	it := &Item{In: in, EventTime: in.PublishTime}
	if a := g.cfg.TimestampAttribute; a != "" {
		t, err := dedup.ParseTimestamp(in.Attributes[a])
		if err != nil {
			return nil, g.reject(ctx, in, fmt.Errorf("attribute %q: %w", a, err))
		}
		it.EventTime = t
	}
	key, src, missing, err := g.cfg.Derive(in.Attributes, in.Data, in.ID)
	if missing {
		g.m.Missing(in.Attributes[g.cfg.ProducerAttribute])
	}
	if err != nil {
		return nil, g.reject(ctx, in, err)
	}
	if it.Source = src; src == dedup.SourceNone {
		return it, ""
	}
	it.Key = key
	it.hash = dedup.KeyOf(key)
	if g.cfg.Audit != nil { // the clock is read per message only for the audit
		it.auditAt = g.auditTime(it.EventTime)
	}
	return it, ""
}

// decide claims a keyed message's key, maps the verdict to an outcome and,
// when the key is this message's to write, runs the work.
func (g *Gate) decide(ctx context.Context, it *Item) outcome.Outcome {
	in := it.In
	if err := g.storeHealth.Wait(ctx); err != nil {
		return outcome.Retried // shutting down during a pause
	}
	start := g.now()
	v, t, err := g.dd.Claim(ctx, it.hash, in.ID, it.EventTime)
	if errors.Is(err, dedup.ErrTooLate) {
		return g.tooLate(ctx, it, err)
	}
	claimed := g.now()
	g.m.storeTime.Observe(max(claimed.Sub(start)-v.Waited, 0).Seconds()) // a wait for our own work is not the store's
	if err != nil {
		return g.storeFailed(ctx, start, err)
	}
	if v.Status != dedup.InFlight { // a local in-flight verdict never reached the store
		g.storeHealth.OK()
	}
	switch v.Status {
	case dedup.Duplicate:
		return g.duplicate(ctx, it, v)
	case dedup.InFlight:
		// It comes back once nacked; a pause keeps that from turning into
		// a hot loop while the first copy is worked on.
		pause(ctx)
		return outcome.InFlightConflict
	case dedup.Proceed:
		it.LateDuplicate = g.suspect(it)
		return g.work(ctx, it, &t, true, claimed)
	}
	return g.unknown(v.Status, in.ID)
}

// duplicate counts a caught copy (in shadow mode, works on it all the same).
func (g *Gate) duplicate(ctx context.Context, it *Item, v dedup.Verdict) outcome.Outcome {
	o, delay := outcome.DuplicateRepublish, g.m.republishDelay
	if v.Kind == dedup.Redelivery {
		o, delay = outcome.DuplicateRedelivery, g.m.redeliveryDelay
	}
	if !v.Expires.IsZero() {
		delay.Observe(v.Age.Seconds())
	}
	if g.cfg.OnDuplicate != nil {
		g.cfg.OnDuplicate(ctx, it.In, v.Kind)
	}
	if g.cfg.Shadow {
		if r := g.work(ctx, it, nil, false, time.Time{}); r != outcome.Emitted {
			return r
		}
	}
	return o
}

func (g *Gate) unknown(s dedup.Status, msgID string) outcome.Outcome {
	g.log.Error("dedup store answered an unknown status; message nacked", "status", s, "message_id", msgID)
	return outcome.Retried
}

// storeFailed handles a claim made at start that failed.
func (g *Gate) storeFailed(ctx context.Context, start time.Time, err error) outcome.Outcome {
	switch {
	case ctx.Err() != nil: // a shutdown is not an outage
	case errors.Is(err, dedup.ErrFatal):
		g.stop(err)
	default:
		g.storeHealth.Fail(start, err)
		// Hold the message through the pause instead of nacking it at
		// once: it would come straight back and find the store still down.
		_ = g.storeHealth.Wait(ctx)
	}
	return outcome.Retried
}

// tooLate applies the late policy to a message the horizon cannot judge.
// Passed on, it is still checked against the audit, which remembers far
// longer than the horizon.
func (g *Gate) tooLate(ctx context.Context, it *Item, reason error) outcome.Outcome {
	var o outcome.Outcome
	if g.cfg.Late == dedup.LateDeadLetter {
		o = g.reject(ctx, it.In, reason)
	} else {
		it.LateDuplicate = g.suspect(it)
		o = g.work(ctx, it, nil, true, time.Time{})
	}
	if o == outcome.Emitted || o == outcome.DeadLettered {
		g.m.TooLate()
	}
	return o
}

// maxRejectHold caps the pause of an unusable message without Reject,
// which grows at each of its deliveries: the cap bounds how long it takes
// a slot of the subscriber's flow control.
const maxRejectHold = 5 * time.Second

// reject moves an unusable message aside, or holds and nacks it.
func (g *Gate) reject(ctx context.Context, in *pubsub.Message, reason error) outcome.Outcome {
	if g.cfg.Reject == nil {
		g.holdBack(ctx, in, reason, "unusable message nacked; it comes back until it is removed: "+g.cfg.Hint)
		return outcome.Retried
	}
	if err := g.rejectHealth.Wait(ctx); err != nil {
		return outcome.Retried
	}
	if err := g.cfg.Reject(g.workContext(ctx), in, reason); err != nil {
		switch {
		case errors.Is(err, dedup.ErrFatal):
			g.stop(err)
		case errors.Is(err, dedup.ErrPermanent):
			// The message's own fault, not the dead-letter topic's: the
			// topic stays healthy for the others.
			g.holdBack(ctx, in, fmt.Errorf("%w; moving it aside failed too: %w", reason, err),
				"unusable message nacked: the dead-letter topic refuses it too; it comes back until it is removed")
			return outcome.Retried
		case ctx.Err() == nil:
			g.rejectHealth.Fail(time.Time{}, err)
		}
		g.log.Warn("moving an unusable message aside failed; message nacked", "message_id", in.ID, "reason", reason, "err", err)
		return outcome.Retried
	}
	g.rejectHealth.OK()
	g.log.Info("message dead-lettered", "message_id", in.ID, "reason", reason)
	return outcome.DeadLettered
}

// holdBack holds an unusable message that cannot be moved aside before its
// nack, longer at each delivery, and logs it at the 1st, 10th, 100th...:
// else a handful of them floods the log and spins the receiver.
func (g *Gate) holdBack(ctx context.Context, in *pubsub.Message, reason error, msg string) {
	g.m.held.Inc()
	g.hold.Wait(ctx, in.ID, 100*time.Millisecond, maxRejectHold, func(n int) {
		g.log.Error(msg, "message_id", in.ID, "deliveries", n, "reason", reason)
	})
}

// pause waits a moment before a nack, jittered so replicas do not retry
// in step.
func pause(ctx context.Context) {
	_ = backoff.Sleep(ctx, pauseDelay())
}

func pauseDelay() time.Duration { return backoff.Delay(1, 100*time.Millisecond, time.Second) }
