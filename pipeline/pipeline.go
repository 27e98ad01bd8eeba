// Package pipeline is the dedup pipeline: it receives Pub/Sub messages,
// drops redeliveries and republished copies within the horizon, writes the
// survivors to a sink, and acks each input only after its output is durable.
//
// Per message, on the decision path every front end shares (internal/gate):
// derive the key; claim it; write to the sink; commit the key; ack. A sink
// or store failure releases the key and nacks, so nothing is lost; a crash
// between write and commit can at worst emit one extra copy, and that copy
// carries the key in an attribute for the next reader. An error that
// retrying cannot fix (dedup.ErrFatal: refused credentials, a dropped
// table) stops Run with that error.
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
	"github.com/dedupflow/dedupflow/internal/advice"
	"github.com/dedupflow/dedupflow/internal/gate"
	"github.com/dedupflow/dedupflow/pubsubio/pull"
	"github.com/dedupflow/dedupflow/sink"
)

const (
	// DefaultOutputIDAttribute is the output id attribute when the policy
	// names no id attribute (publisher.DefaultIDAttribute is the input's).
	DefaultOutputIDAttribute = "dedupflow_id"
	// AttrLateDuplicate marks an output whose key the audit filter saw
	// beyond the exact horizon; its value is LateDuplicateProbable (the
	// filter is approximate, so never "certain").
	AttrLateDuplicate     = gate.AttrLateDuplicate
	LateDuplicateProbable = gate.LateDuplicateProbable
	// DefaultAuditSaveEvery is how often the audit filter is saved.
	DefaultAuditSaveEvery = time.Minute
)

// Config configures a Pipeline.
type Config struct {
	// Policy is how messages are deduped, as in the consumer: the key, the
	// event time, the horizon and the lease (see dedup.Policy). A message
	// without a usable key or event time, or too late to judge under
	// dedup.LateDeadLetter, goes to the dead-letter topic.
	dedup.Policy
	// OutputIDAttribute carries the key on outputs.
	OutputIDAttribute string
	// WriteTimeout bounds one sink write; it must be shorter than the lease.
	WriteTimeout time.Duration
	// Shadow makes and counts every decision but emits every message, to
	// measure duplicate rates before turning dedup on.
	Shadow bool
	// Audit, when Audit.Horizon is set, remembers emitted keys for that
	// long (longer than the dedup horizon) to mark late duplicates.
	Audit audit.Options
	// AuditFile is a file the audit filter is loaded from when Run
	// starts and saved to every AuditSaveEvery and when Run returns;
	// empty: the audit starts empty on every start.
	AuditFile      string
	AuditSaveEvery time.Duration
}

// Validate checks the configuration and fills its defaults: the policy's,
// the output id attribute (the id attribute, else DefaultOutputIDAttribute), the
// write timeout (half the lease) and how often the audit is saved.
func (c *Config) Validate() error {
	if err := c.Policy.Validate(); err != nil {
		return err
	}
	if c.OutputIDAttribute == "" {
		c.OutputIDAttribute = c.IDAttribute
		if c.OutputIDAttribute == "" {
			c.OutputIDAttribute = DefaultOutputIDAttribute
		}
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = c.Lease / 2
	}
	if c.WriteTimeout >= c.Lease {
		return fmt.Errorf("write timeout %v must be shorter than the claim lease %v", c.WriteTimeout, c.Lease)
	}
	if c.Audit.Horizon > 0 && c.Audit.Horizon <= c.Horizon {
		return fmt.Errorf("audit horizon %v must be longer than the dedup horizon %v", c.Audit.Horizon, c.Horizon)
	}
	if c.AuditSaveEvery <= 0 {
		c.AuditSaveEvery = DefaultAuditSaveEvery
	}
	return nil
}

// Deps are what a Pipeline talks to.
type Deps struct {
	// Store holds the claimed and written keys: store/mem, store/disk,
	// store/redis.
	Store      dedup.Store
	Sink       sink.Sink
	DeadLetter sink.Sink // nil: invalid messages are nacked and logged
	Logger     *slog.Logger
	Now        func() time.Time
	Registerer prometheus.Registerer // nil: no metrics exported
	// HorizonKeys reports the store's live keys for the gauge, if it can.
	HorizonKeys func() int
	// AuditTarget keeps the audit filter across restarts (Redis, say);
	// nil: Config.AuditFile's file, if set.
	AuditTarget audit.Target
}

// Pipeline dedups one stream.
type Pipeline struct {
	cfg  Config
	gate *gate.Gate
	log  *slog.Logger

	audit       *audit.Filter // nil: no audit horizon
	auditTarget audit.Target  // nil: the audit is not kept across restarts
	reg         prometheus.Registerer
	own         *prometheus.Registry // the gate's metrics, for Advice
	now         func() time.Time
}

// New validates cfg and returns a Pipeline.
func New(cfg Config, d Deps) (*Pipeline, error) {
	if d.Store == nil || d.Sink == nil {
		return nil, errors.New("pipeline needs a store and a sink")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	p := &Pipeline{cfg: cfg, log: d.Logger, reg: d.Registerer}
	if cfg.Audit.Horizon > 0 {
		if err := p.openAudit(d); err != nil {
			return nil, err
		}
	}
	gc := gate.Config{
		Policy: cfg.Policy, Store: d.Store, Shadow: cfg.Shadow, Audit: p.audit,
		// The write outlives a shutdown signal: finishing it (and acking)
		// is better than leaving a key pending until its lease runs out.
		Work:          gate.Work{Name: "sink", Do: gate.WriteTo(d.Sink, cfg.OutputIDAttribute), Dependency: true, Outlive: true},
		RejectName:    "dead-letter topic",
		Hint:          "set --dead-letter-topic to move such messages aside",
		SettleTimeout: cfg.WriteTimeout, HorizonKeys: d.HorizonKeys,
		Logger: d.Logger, Now: d.Now,
	}
	if d.DeadLetter != nil {
		gc.Reject = gate.DeadLetterTo(d.DeadLetter)
	}
	g, err := gate.New(gc)
	if err != nil {
		return nil, err
	}
	p.gate = g
	p.now = d.Now
	if p.now == nil {
		p.now = time.Now
	}
	p.own = prometheus.NewRegistry()
	if err := p.own.Register(g.Collector()); err != nil {
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	if d.Registerer != nil {
		if err := d.Registerer.Register(g.Collector()); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return p, nil
}

func (p *Pipeline) openAudit(d Deps) error {
	cfg := &p.cfg
	if cfg.Audit.Logger == nil {
		cfg.Audit.Logger = d.Logger
	}
	a, err := audit.New(cfg.Audit)
	if err != nil {
		return err
	}
	p.audit = a
	p.auditTarget = d.AuditTarget
	if p.auditTarget == nil && cfg.AuditFile != "" {
		p.auditTarget = audit.File(cfg.AuditFile)
	}
	p.log.Info("audit horizon on: copies after the dedup horizon are marked, not dropped",
		"audit_horizon", cfg.Audit.Horizon.String(), "capacity", cfg.Audit.Capacity,
		"false_positive", cfg.Audit.FalsePositive, "bytes", a.Stats().Bytes, "kept_in", keptIn(p.auditTarget))
	return nil
}

// Counts returns the counters so far.
func (p *Pipeline) Counts() Counts { return p.gate.Counts() }

// Advice is horizon advice from the copies seen so far (see
// dedupflow advise): the share of republishes the horizon caught and the
// horizon 99.9% would need, or why there is no advice yet.
func (p *Pipeline) Advice() string {
	mfs, err := p.own.Gather()
	if err != nil {
		return "no horizon advice: " + err.Error()
	}
	return advice.From(mfs, p.now()).Text
}

// Ready reports whether the store, the sink and the dead-letter topic are
// reachable, and nothing fatal happened.
func (p *Pipeline) Ready() bool { return p.gate.Ready() }

// Receiver is the input: a *pubsub.Subscriber.
type Receiver interface {
	Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error
}

// Run receives until ctx is done, or until an error that retrying cannot
// fix, which it returns. In-flight messages are finished (their writes are
// bounded by WriteTimeout) or nacked before it returns. With an audit
// file, the audit filter is loaded first and saved for the last
// time after the last message. The official client's Subscriber does not
// return while its server is unreachable: give it wrapped in
// pubsubio.StopWithin, or use RunBatch, which stops either way.
func (p *Pipeline) Run(ctx context.Context, in Receiver) error {
	ctx, stop := p.start(ctx)
	defer stop()
	err := in.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		// Not AckWithResult: with exactly-once delivery an ack the server
		// refuses means the message comes back, and it is then caught as
		// a redelivery, so waiting for the result changes nothing (and
		// the result cost a channel per message on every subscription).
		p.Handle(ctx, m).Settle(ctx, m)
	})
	return p.ended(err)
}

// RunBatch is Run on the batch path (pull.New makes in): in hands over a
// StreamingPull response's messages at a time, the pipeline decides them
// with HandleBatch, and in acks and nacks each as its result says. The
// Registerer gets in's stream and invalid-ack counters for the run.
func (p *Pipeline) RunBatch(ctx context.Context, in *pull.Receiver) error {
	if p.reg != nil {
		c := in.Collector()
		if err := p.reg.Register(c); err != nil {
			return fmt.Errorf("register the receiver's metrics: %w", err)
		}
		defer p.reg.Unregister(c)
	}
	ctx, stop := p.start(ctx)
	defer stop()
	err := in.Receive(ctx, func(ctx context.Context, ms []*pubsub.Message, rs []pull.Result) {
		out := make([]Result, len(ms))
		p.HandleBatch(ctx, ms, out)
		for i, r := range out {
			rs[i] = pull.Result{Ack: r.Outcome.Acked(), NackAfter: r.NackAfter}
		}
	})
	return p.ended(err)
}

// ended is a run's result from its receiver's: the gate's fatal error
// first, a stop is no error.
func (p *Pipeline) ended(err error) error {
	if ferr := p.gate.Err(); ferr != nil {
		return ferr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("receive: %w", err)
	}
	return nil
}

// start begins a run: the audit's saving, and a context that ends with
// ctx or when the gate stops on a fatal error. stop ends both.
func (p *Pipeline) start(ctx context.Context) (context.Context, func()) {
	var saver *audit.Saver
	if to := p.auditTarget; to != nil {
		saver = audit.StartSaving(ctx, p.audit, to, p.cfg.AuditSaveEvery, p.log)
	}
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-p.gate.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		cancel()
		p.gate.Drain() // the commits still retried, before the last audit save
		if saver != nil {
			saver.Stop()
		}
	}
}

// Handle processes one message and returns its result: ack it, or nack
// it after the result's NackAfter (Result.Settle does either).
func (p *Pipeline) Handle(ctx context.Context, in *pubsub.Message) Result {
	return p.gate.Pass(ctx, in)
}

// HandleBatch processes a batch of messages, as a StreamingPull response
// brings them, and sets rs[i] to the result of ins[i]. Each message is
// decided as Handle decides it; the batch shares the store's calls, one
// sink write and one write to the dead-letter topic (see gate.PassBatch).
func (p *Pipeline) HandleBatch(ctx context.Context, ins []*pubsub.Message, rs []Result) {
	p.gate.PassBatch(ctx, ins, rs)
}

func keptIn(t audit.Target) string {
	if t == nil {
		return "memory only"
	}
	return t.String()
}
