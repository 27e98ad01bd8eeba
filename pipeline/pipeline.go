// Package pipeline is the dedup pipeline: it receives Pub/Sub messages,
// drops redeliveries and republished copies within the horizon, writes the
// survivors to a sink, and acks each input only after its output is durable.
//
// Per message: derive the key; claim it; write to the sink; commit the key;
// ack. A sink or store failure releases the key and nacks, so nothing is
// lost; a crash between write and commit can at worst emit one extra copy,
// and that copy carries the key in an attribute for the next reader.
//
// With an audit horizon, every emitted key is also remembered, approximately
// and for much longer, in an audit.Filter; a copy that the exact horizon
// lets through but the audit recognises is still emitted (the horizon's
// contract), marked dedupflow_late_duplicate=probable and counted in
// dedupflow_late_duplicates_suspected_total.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/sink"
)

// Attributes the pipeline sets on dead-lettered messages.
const (
	AttrError           = "dedupflow_error"
	AttrSourceMessageID = "dedupflow_source_message_id"
	DefaultIDAttribute  = "dedupflow_id"
	// AttrLateDuplicate marks an output whose key the audit filter saw
	// beyond the exact horizon; its value is LateDuplicateProbable (the
	// filter is approximate, so never "certain").
	AttrLateDuplicate     = "dedupflow_late_duplicate"
	LateDuplicateProbable = "probable"
	// DefaultAuditSnapshotEvery is how often the audit filter is saved.
	DefaultAuditSnapshotEvery = time.Minute
)

// Config configures a Pipeline.
type Config struct {
	Rule dedup.Rule
	// TimestampAttribute holds the event time (ms since the epoch or RFC
	// 3339); empty means the publish time.
	TimestampAttribute string
	// ProducerAttribute labels missing-id counts, so the one producer in a
	// fleet that forgets the key can be found.
	ProducerAttribute string
	// OutputIDAttribute carries the key on outputs.
	OutputIDAttribute string
	// WriteTimeout bounds one sink write; it must be shorter than the lease.
	WriteTimeout time.Duration
	// Shadow makes and counts every decision but emits every message, to
	// measure duplicate rates before turning dedup on.
	Shadow bool
	// Late is what happens, in event time, to a message too late to judge
	// (see dedup.Deduper.ClaimEvent).
	Late dedup.Late
	// Audit, when Audit.Horizon is set, remembers emitted keys for that
	// long (longer than the dedup horizon) to mark late duplicates.
	Audit audit.Options
	// AuditSnapshot is a file the audit filter is loaded from when Run
	// starts and saved to every AuditSnapshotEvery and when Run returns;
	// empty: the audit starts empty on every start.
	AuditSnapshot      string
	AuditSnapshotEvery time.Duration
}

// Deps are what a Pipeline talks to.
type Deps struct {
	Deduper    *dedup.Deduper
	Sink       sink.Sink
	DeadLetter sink.Sink // nil: invalid messages are nacked and logged
	Logger     *slog.Logger
	Now        func() time.Time
	Registerer prometheus.Registerer // nil: no metrics exported
	// HorizonKeys reports the store's live keys for the gauge, if it can.
	HorizonKeys func() int
	// AuditTarget keeps the audit filter across restarts (Redis, say);
	// nil: Config.AuditSnapshot's file, if set.
	AuditTarget audit.Target
}

// Pipeline dedups one stream.
type Pipeline struct {
	cfg   Config
	dd    *dedup.Deduper
	sink  sink.Sink
	dl    sink.Sink
	log   *slog.Logger
	now   func() time.Time
	m     *metrics
	store *backoff.Tracker
	out   *backoff.Tracker
	dlOut *backoff.Tracker
	audit *audit.Filter // nil: no audit horizon

	strikes backoff.Strikes // invalid messages nacked, without a dead-letter topic

	auditTarget audit.Target // nil: the audit is not kept across restarts

	writeBy *deadlines // bounds sink writes, commits and releases by WriteTimeout
}

// New validates cfg and returns a Pipeline.
func New(cfg Config, d Deps) (*Pipeline, error) {
	if d.Deduper == nil || d.Sink == nil {
		return nil, errors.New("pipeline needs a deduper and a sink")
	}
	if cfg.OutputIDAttribute == "" {
		cfg.OutputIDAttribute = cfg.Rule.IDAttribute
		if cfg.OutputIDAttribute == "" {
			cfg.OutputIDAttribute = DefaultIDAttribute
		}
	}
	if cfg.WriteTimeout == 0 {
		cfg.WriteTimeout = d.Deduper.Lease() / 2
	}
	if cfg.WriteTimeout >= d.Deduper.Lease() {
		return nil, fmt.Errorf("write timeout %v must be shorter than the claim lease %v", cfg.WriteTimeout, d.Deduper.Lease())
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	p := &Pipeline{cfg: cfg, dd: d.Deduper, sink: d.Sink, dl: d.DeadLetter, log: d.Logger, now: d.Now, m: newMetrics(),
		writeBy: newDeadlines(cfg.WriteTimeout)}
	p.m.horizon = d.HorizonKeys
	if p.dd.Domain() == dedup.EventTime {
		p.m.watermark = p.dd.Watermark
	}
	if cfg.Audit.Horizon > 0 {
		if cfg.Audit.Horizon <= d.Deduper.Horizon() {
			return nil, fmt.Errorf("audit horizon %v must be longer than the dedup horizon %v", cfg.Audit.Horizon, d.Deduper.Horizon())
		}
		if cfg.Audit.Logger == nil {
			cfg.Audit.Logger = d.Logger
		}
		a, err := audit.New(cfg.Audit)
		if err != nil {
			return nil, err
		}
		p.audit = a
		p.m.audit = a.Stats
		p.auditTarget = d.AuditTarget
		if p.auditTarget == nil && cfg.AuditSnapshot != "" {
			p.auditTarget = audit.File(cfg.AuditSnapshot)
		}
		p.log.Info("audit horizon on: copies after the dedup horizon are marked, not dropped",
			"audit_horizon", cfg.Audit.Horizon.String(), "capacity", cfg.Audit.Capacity,
			"false_positive", cfg.Audit.FalsePositive, "bytes", a.Stats().Bytes, "kept_in", keptIn(p.auditTarget))
		if p.cfg.AuditSnapshotEvery <= 0 {
			p.cfg.AuditSnapshotEvery = DefaultAuditSnapshotEvery
		}
	}
	p.store = backoff.NewTracker("dedup store", "nacking and backing off", p.log, d.Now)
	p.out = backoff.NewTracker("sink", "nacking and backing off", p.log, d.Now)
	p.dlOut = backoff.NewTracker("dead-letter topic", "nacking invalid messages and backing off", p.log, d.Now)
	p.m.watch(p.store, p.out, p.dlOut, d.DeadLetter != nil)
	if d.Registerer != nil {
		if err := d.Registerer.Register(p.m); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return p, nil
}

// Counts returns the counters so far.
func (p *Pipeline) Counts() Counts { return p.m.snapshot() }

// Ready reports whether the store, the sink and the dead-letter topic are
// reachable.
func (p *Pipeline) Ready() bool { return p.store.Ready() && p.out.Ready() && p.dlOut.Ready() }

// Receiver is the input: a *pubsub.Subscriber.
type Receiver interface {
	Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error
}

// Run receives until ctx is done. In-flight messages are finished (their
// writes are bounded by WriteTimeout) or nacked before it returns. With an
// audit snapshot file, the audit filter is loaded first and saved for the
// last time after the last message.
func (p *Pipeline) Run(ctx context.Context, in Receiver) error {
	if to := p.auditTarget; to != nil {
		s := audit.StartSnapshots(ctx, p.audit, to, p.cfg.AuditSnapshotEvery, p.log)
		defer s.Stop()
	}
	err := in.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		if !p.Handle(ctx, m) {
			m.Nack()
			return
		}
		// Not AckWithResult: with exactly-once delivery an ack the server
		// refuses means the message comes back, and it is then caught as
		// a redelivery, so waiting for the result changes nothing (and
		// the result cost a channel per message on every subscription).
		m.Ack()
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("receive: %w", err)
	}
	return nil
}

// Handle processes one message and reports whether to ack it (true) or
// nack it so it comes back (false).
func (p *Pipeline) Handle(ctx context.Context, in *pubsub.Message) bool {
	p.m.Received()
	o := p.handle(ctx, in)
	p.m.Count(o)
	return o.Acked()
}

func (p *Pipeline) handle(ctx context.Context, in *pubsub.Message) Outcome {
	m := &sink.Message{ID: in.ID, Data: in.Data, Attributes: in.Attributes, PublishTime: in.PublishTime, EventTime: in.PublishTime}
	if a := p.cfg.TimestampAttribute; a != "" {
		t, err := dedup.ParseTimestamp(in.Attributes[a])
		if err != nil {
			return p.deadLetter(ctx, m, fmt.Errorf("attribute %q: %w", a, err))
		}
		m.EventTime = t
	}
	key, src, missing, err := p.cfg.Rule.DeriveBody(in.Attributes, in.Data, in.ID)
	if missing {
		p.m.Missing(in.Attributes[p.cfg.ProducerAttribute])
	}
	if err != nil {
		return p.deadLetter(ctx, m, err)
	}
	if src == dedup.NoKey {
		return p.emit(ctx, m, nil, nil)
	}
	m.Key = key
	n := &note{k: dedup.KeyOf(key), at: p.auditTime(m)}

	if err := p.store.Wait(ctx); err != nil {
		return Retried
	}
	start := p.now()
	v, t, err := p.dd.ClaimEvent(ctx, n.k, in.ID, m.EventTime)
	if errors.Is(err, dedup.ErrTooLate) {
		return p.tooLate(ctx, m, n, err)
	}
	p.m.storeTime.Observe(max(since(start, p.now())-v.Waited.Seconds(), 0)) // a wait for our own write is not the store's
	if err != nil {
		if ctx.Err() == nil { // a shutdown is not an outage
			p.store.Fail(err)
		}
		return Retried
	}
	if v.Status != dedup.InFlight { // a local in-flight verdict never reached the store
		p.store.OK()
	}
	switch v.Status {
	case dedup.Duplicate:
		o := DuplicateRepublish
		if v.Kind == dedup.Redelivery {
			o = DuplicateRedelivery
		}
		if p.cfg.Shadow {
			if r := p.emit(ctx, m, nil, nil); r != Emitted {
				return r
			}
		}
		return o
	case dedup.InFlight:
		// It comes back once nacked; a pause keeps that from turning into
		// a hot loop while the first copy is being written.
		hold(ctx)
		return InFlightConflict
	}
	p.suspect(n)
	return p.emit(ctx, m, &t, n)
}

func keptIn(t audit.Target) string {
	if t == nil {
		return "memory only"
	}
	return t.String()
}

// note is what the audit needs of a keyed message.
type note struct {
	k       dedup.Key
	at      time.Time // the message's time on the horizon's clock
	suspect bool      // the audit saw the key before
}

// auditTime is the time the audit files a key under: the processing clock,
// or in event time the event time, held back to the processing clock (as
// the watermark is) so a producer's future-dated clock cannot rotate every
// generation out.
func (p *Pipeline) auditTime(m *sink.Message) time.Time {
	now := p.now()
	if p.dd.Domain() == dedup.EventTime && m.EventTime.Before(now) {
		return m.EventTime
	}
	return now
}

// suspect asks the audit whether a key the exact horizon no longer holds
// was seen before.
func (p *Pipeline) suspect(n *note) {
	n.suspect = p.audit != nil && p.audit.Contains(n.k, n.at)
}

// tooLate applies the late policy to a message the horizon cannot judge.
// Passed on, it is still checked against the audit, which remembers far
// longer than the horizon.
func (p *Pipeline) tooLate(ctx context.Context, m *sink.Message, n *note, reason error) Outcome {
	var o Outcome
	if p.cfg.Late == dedup.LateDeadLetter {
		o = p.deadLetter(ctx, m, reason)
	} else {
		p.suspect(n)
		o = p.emit(ctx, m, nil, n)
	}
	if o == Emitted || o == DeadLettered {
		p.m.tooLate.Add(1)
	}
	return o
}

// emit writes m to the sink; with a ticket, it commits or releases the key.
// With a note, the key goes into the audit once written.
func (p *Pipeline) emit(ctx context.Context, m *sink.Message, t *dedup.Ticket, n *note) Outcome {
	out := m // the input stays as it came, for a dead letter
	if m.Key != "" {
		attrs := make(map[string]string, len(m.Attributes)+2)
		for k, v := range m.Attributes {
			attrs[k] = v
		}
		attrs[p.cfg.OutputIDAttribute] = m.Key
		if n != nil && n.suspect {
			attrs[AttrLateDuplicate] = LateDuplicateProbable
		}
		c := *m
		c.Attributes = attrs
		out = &c
	}
	err := p.out.Wait(ctx)
	if err == nil {
		// The write outlives a shutdown signal: finishing it (and acking)
		// is better than leaving a key pending until its lease runs out.
		start := p.now()
		err = p.sink.Write(p.writeBy.ctx(), out)
		p.m.sinkTime.Observe(since(start, p.now()))
	}
	if err != nil {
		if t != nil {
			if rerr := p.dd.Release(p.writeBy.ctx(), *t); rerr != nil {
				p.log.Warn("release after a failed write; the key stays claimed until its lease ends",
					"key", m.Key, "message_id", m.ID, "err", rerr)
			}
		}
		if errors.Is(err, sink.ErrPermanent) {
			return p.deadLetter(ctx, m, err)
		}
		if ctx.Err() == nil {
			p.out.Fail(err)
		}
		return Retried
	}
	p.out.OK()
	if n != nil && p.audit != nil {
		p.audit.Add(n.k, n.at)
		if n.suspect {
			p.m.lateSuspected.Add(1)
			p.log.Debug("probable late duplicate emitted", "key", m.Key, "message_id", m.ID)
		}
	}
	if t != nil {
		p.commit(context.WithoutCancel(ctx), m, *t)
	}
	p.m.latency.Observe(since(m.PublishTime, p.now()))
	return Emitted
}

// commit records the key after a good write, retrying within the lease:
// once the lease ends a copy could pass. If the store stays down the input
// is acked all the same — the output is written, and nacking would only
// write it again — and a copy that slips through carries the key.
func (p *Pipeline) commit(bg context.Context, m *sink.Message, t dedup.Ticket) {
	deadline := p.now().Add(p.dd.Lease() / 2)
	for n := 1; ; n++ {
		err := p.dd.Commit(p.writeBy.ctx(), t)
		if err == nil {
			return
		}
		pause := backoff.Delay(n, 100*time.Millisecond, 2*time.Second)
		if p.now().Add(pause).After(deadline) {
			p.log.Warn("commit after write failed; acking, a later copy may pass carrying the key",
				"key", m.Key, "message_id", m.ID, "err", err)
			return
		}
		_ = backoff.Sleep(bg, pause)
	}
}

// hold pauses before a nack, jittered so replicas do not retry in step.
func hold(ctx context.Context) {
	_ = backoff.Sleep(ctx, backoff.Delay(1, 50*time.Millisecond, time.Second))
}
