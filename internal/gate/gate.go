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
	"log/slog"
	"sync"
	"sync/atomic"
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
	// Retaken: a process may have written this key before and died before
	// it committed it (see sink.Message.Retaken): the store held an
	// abandoned claim of the key, or the message came within a horizon of
	// this gate's start.
	Retaken bool

	// hash is Key as the store and the audit hold it (dedup.KeyOf), and
	// auditAt the time the audit files it under (set with an audit only).
	hash    dedup.Key
	auditAt time.Time
}

// Work is the front end's step: write to a sink, call a handler.
type Work struct {
	// Name names the step in logs and in the dedupflow_NAME_batch_seconds
	// histogram: "sink", "handler".
	Name string
	// Do does the work of its at once (one sink write, say) and sets
	// errs[i] to its[i]'s result: nil means done, an error wrapping
	// dedup.ErrPermanent sends the message to Reject, one wrapping
	// dedup.ErrFatal stops the gate, any other brings it back. its holds
	// one item on a receiver that hands over one message at a time.
	Do func(ctx context.Context, its []*Item, errs []error)
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
	// Reject takes messages that cannot be used (no usable key or time, a
	// permanent work error) aside, all at once, with the reason for each:
	// errs[i] is ins[i]'s result, and nil acks it. Nil Reject: such a
	// message is held back and nacked, logged with Hint (how to move such
	// messages aside).
	Reject func(ctx context.Context, ins []*pubsub.Message, reasons, errs []error)
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
	// started is when the gate began: a message published before it may
	// have been in a stopped process's hands.
	started time.Time

	storeHealth  *backoff.Tracker
	workHealth   *backoff.Tracker // nil unless the work is a dependency
	rejectHealth *backoff.Tracker

	retries sync.WaitGroup // commits retried apart from the path

	fatalOnce sync.Once
	fatal     error
	done      chan struct{}

	missingWarned atomic.Int64 // when the last keyless message was warned of, g.now in ns
}

// New validates cfg and returns a Gate.
func New(cfg Config) (*Gate, error) {
	if cfg.Store == nil || cfg.Work.Do == nil || cfg.Work.Name == "" {
		return nil, errors.New("gate needs a store and named work")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	// The Deduper validates the policy, once, and fills its defaults.
	dd, err := dedup.New(cfg.Store, dedup.Options{Policy: cfg.Policy, Now: cfg.Now})
	if err != nil {
		return nil, err
	}
	if cfg.SettleTimeout <= 0 {
		cfg.SettleTimeout = dd.Lease() / 2
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
	g.started = g.now()
	g.m.horizonS, g.m.mode, g.m.started = g.dd.Horizon().Seconds(), g.dd.Mode().String(), g.started
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

// missingEvery spaces the warnings about messages without a key: once a
// minute tells an operator that publishers do not stamp it (a misspelt
// attribute, say) without flooding the log.
const missingEvery = time.Minute

// warnMissing warns, at most once per missingEvery, that messages come
// without the key the policy names, and what that costs them.
func (g *Gate) warnMissing(producer string) {
	now, last := g.now().UnixNano(), g.missingWarned.Load()
	if last != 0 && now-last < int64(missingEvery) || !g.missingWarned.CompareAndSwap(last, now) {
		return
	}
	p := g.cfg.Policy
	what := "without the id attribute " + p.IDAttribute
	switch p.From {
	case dedup.KeyFromJSON:
		what = "without a key at JSON path " + p.Path
	case dedup.KeyFromHash:
		what = "with an empty payload (no hash to key on)"
	}
	cost := "deduped on their message ID only, so a republished copy passes"
	if p.Missing == dedup.Pass {
		cost = "passed without dedup"
	}
	g.log.Warn("messages "+what+" are "+cost+"; do the publishers stamp it?",
		"missing_id", p.Missing.String(), "producer", producer, "missing_id_total", g.m.Snapshot().MissingID)
}
