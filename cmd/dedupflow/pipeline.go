package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/audit/redisaudit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/dedupflow/dedupflow/sink/topic"
)

// job is a configured pipeline, shared by `pipeline` and `up`.
type job struct {
	project        string
	inSub, inTopic string
	outTopic       string
	deadLetter     string
	idAttr         string
	tsAttr         string
	producerAttr   string
	outIDAttr      string
	horizon        time.Duration
	missing        string
	state          string
	sink           string
	table          string
	onConflict     string
	stdout         io.Writer // for --sink stdout
	shadow         bool
	maxOutstanding int
	metricsAddr    string
	keyFrom        string
	timeDomain     string
	lateness       time.Duration
	late           string
	auditHorizon   time.Duration
	auditFP        float64
	auditCapacity  uint
	given          map[string]bool // flags set on the command line or from the environment
}

func (j *job) register(fs *flag.FlagSet) {
	fs.StringVar(&j.project, "project", "", "Google Cloud project of short resource IDs")
	fs.StringVar(&j.inSub, "input-subscription", "", "subscription to read (ID or projects/P/subscriptions/S)")
	fs.StringVar(&j.inTopic, "input-topic", "", "topic to read through a subscription of our own, removed on exit")
	fs.StringVar(&j.outTopic, "output-topic", "", "topic the survivors are published to")
	fs.StringVar(&j.deadLetter, "dead-letter-topic", "", "topic for messages that cannot be processed, with the reason")
	fs.StringVar(&j.idAttr, "id-attribute", "", "attribute holding the publisher's stable key (empty: the message ID)")
	fs.StringVar(&j.tsAttr, "timestamp-attribute", "", "attribute holding the event time (ms since epoch or RFC 3339)")
	fs.StringVar(&j.producerAttr, "producer-attribute", "", "attribute naming the producer, to label missing-key counts")
	fs.StringVar(&j.outIDAttr, "output-id-attribute", "", "attribute carrying the key on outputs (default: --id-attribute, or dedupflow_id)")
	fs.DurationVar(&j.horizon, "horizon", dedup.DefaultHorizon, "how long a key is remembered, from first sight")
	fs.StringVar(&j.missing, "missing-id", "fallback", "a message without the id attribute: fallback (to the message ID), reject (dead-letter) or pass")
	fs.StringVar(&j.state, "state", "mem", "where the horizon lives: mem, file:PATH (survives restarts) or redis://host:port/db (shared by replicas)")
	fs.StringVar(&j.sink, "sink", "pubsub", "where survivors go: pubsub (the output topic), stdout (JSON lines) or postgres://… (see --table)")
	fs.StringVar(&j.table, "table", "events", "table of a database sink")
	fs.StringVar(&j.onConflict, "on-conflict", "nothing", "database sink, key already written: nothing (keep the first row) or update (last write wins)")
	fs.BoolVar(&j.shadow, "shadow", false, "decide and count duplicates but emit every message")
	fs.IntVar(&j.maxOutstanding, "max-outstanding", 4000, "messages held at once (per stream, the server hands out at most this many unacked; acks go out every 100 ms, so this bounds throughput)")
	fs.StringVar(&j.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz (empty: off)")
	fs.StringVar(&j.keyFrom, "key-from", "attribute", "where the key is: attribute (--id-attribute, else the message ID), json:PATH (a field of a JSON payload) or hash (SHA-256 of the payload)")
	fs.StringVar(&j.timeDomain, "time-domain", "processing", "clock of the horizon: processing, or event (expires when the watermark passes event time + horizon)")
	fs.DurationVar(&j.lateness, "allowed-lateness", time.Minute, "event time: how far the watermark trails the highest event time seen")
	fs.StringVar(&j.late, "late", "pass", "event time: a message too late to judge: pass (emit, counted) or dead-letter")
	fs.Func("audit-horizon", "remember keys this long (e.g. 7d), approximately, to mark copies after --horizon as probable late duplicates (default off)", func(s string) (err error) {
		j.auditHorizon, err = audit.ParseDuration(s)
		return err
	})
	fs.Float64Var(&j.auditFP, "audit-fp", audit.DefaultFalsePositive, "false-positive rate of the audit filter at --audit-capacity")
	fs.UintVar(&j.auditCapacity, "audit-capacity", audit.DefaultCapacity, "distinct keys per --audit-horizon the audit filter is sized for (memory is fixed at start)")
}

// names resolves and checks the resource flags.
func (j *job) names() (in, out, dl pubsubio.Name, fromTopic bool, err error) {
	switch {
	case j.inSub != "" && j.inTopic != "":
		err = errors.New("give --input-subscription or --input-topic, not both")
	case j.inSub != "":
		in, err = pubsubio.SubscriptionName(j.project, j.inSub)
	case j.inTopic != "":
		in, err = pubsubio.TopicName(j.project, j.inTopic)
		fromTopic = true
	default:
		err = errors.New("missing input: give --input-subscription or --input-topic")
	}
	if err != nil {
		return
	}
	if err = j.checkSink(); err != nil {
		return
	}
	if j.outTopic != "" {
		if out, err = pubsubio.TopicName(j.project, j.outTopic); err != nil {
			return
		}
	}
	if j.deadLetter != "" {
		dl, err = pubsubio.TopicName(j.project, j.deadLetter)
	}
	return
}

func (j *job) config() (pipeline.Config, dedup.Options, error) {
	missing, err := dedup.ParseMissing(j.missing)
	if err != nil {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--missing-id: %w", err)
	}
	if err := j.checkAttributes(); err != nil {
		return pipeline.Config{}, dedup.Options{}, err
	}
	from, path, err := dedup.ParseKeyFrom(j.keyFrom)
	if err != nil {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--key-from: %w", err)
	}
	if from != dedup.KeyFromAttribute && j.idAttr != "" {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--id-attribute is not read with --key-from %s; name the outputs' key attribute with --output-id-attribute", j.keyFrom)
	}
	if missing != dedup.Fallback && j.idAttr == "" && from == dedup.KeyFromAttribute {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--missing-id %s needs --id-attribute", j.missing)
	}
	if missing == dedup.Reject && j.deadLetter == "" {
		return pipeline.Config{}, dedup.Options{}, errors.New("--missing-id reject needs --dead-letter-topic to send rejected messages to")
	}
	if j.maxOutstanding < 1 {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--max-outstanding %d must be at least 1", j.maxOutstanding)
	}
	// A copy of a key this process is writing waits for that write (it
	// ends within a lease) rather than being nacked and redelivered.
	opt := dedup.Options{Horizon: j.horizon, AllowedLateness: j.lateness, LocalWait: dedup.DefaultLease}
	if j.horizon < dedup.MinHorizon {
		return pipeline.Config{}, dedup.Options{}, fmt.Errorf("--horizon %v is below the minimum of %v", j.horizon, dedup.MinHorizon)
	}
	if err := j.checkState(); err != nil {
		return pipeline.Config{}, dedup.Options{}, err
	}
	ev, err := j.eventConfig(&opt)
	if err != nil {
		return pipeline.Config{}, dedup.Options{}, err
	}
	return pipeline.Config{
		Late:               ev.Late,
		Audit:              ev.Audit,
		AuditSnapshot:      ev.AuditSnapshot,
		Rule:               dedup.Rule{IDAttribute: j.idAttr, Missing: missing, From: from, Path: path},
		TimestampAttribute: j.tsAttr,
		ProducerAttribute:  j.producerAttr,
		OutputIDAttribute:  j.outIDAttr,
		Shadow:             j.shadow,
	}, opt, nil
}

// eventConfig checks the event-time and audit flags.
func (j *job) eventConfig(opt *dedup.Options) (pipeline.Config, error) {
	var cfg pipeline.Config
	var err error
	if opt.Domain, err = dedup.ParseTimeDomain(j.timeDomain); err != nil {
		return cfg, fmt.Errorf("--time-domain: %w", err)
	}
	if j.lateness < 0 {
		return cfg, fmt.Errorf("--allowed-lateness %v must not be negative", j.lateness)
	}
	if cfg.Late, err = dedup.ParseLate(j.late); err != nil {
		return cfg, fmt.Errorf("--late: %w", err)
	}
	if cfg.Late == dedup.LateDeadLetter && (opt.Domain != dedup.EventTime || j.deadLetter == "") {
		return cfg, errors.New("--late dead-letter needs --time-domain event and --dead-letter-topic")
	}
	if j.auditHorizon == 0 {
		return cfg, nil
	}
	if err := j.checkAuditSize(); err != nil {
		return cfg, err
	}
	if j.auditHorizon <= j.horizon {
		return cfg, fmt.Errorf("--audit-horizon %v must be longer than --horizon %v", j.auditHorizon, j.horizon)
	}
	cfg.Audit = audit.Options{Horizon: j.auditHorizon, FalsePositive: j.auditFP, Capacity: j.auditCapacity}
	if err := cfg.Audit.Validate(); err != nil {
		return cfg, fmt.Errorf("--audit-horizon/--audit-fp/--audit-capacity: %w", err)
	}
	// Beside the disk store's file, so the audit survives restarts with it.
	if path, ok := strings.CutPrefix(j.state, "file:"); ok {
		cfg.AuditSnapshot = path + ".audit"
	}
	return cfg, nil
}

// auditTarget keeps the audit in Redis when the dedup store is there, so
// replicas pool it and it survives restarts (with file:PATH, config named
// a snapshot file instead).
func (j *job) auditTarget(ctx context.Context, cfg pipeline.Config, deps *pipeline.Deps) (func(), error) {
	if cfg.Audit.Horizon == 0 || !(strings.HasPrefix(j.state, "redis://") || strings.HasPrefix(j.state, "rediss://")) {
		return func() {}, nil
	}
	t, err := redisaudit.Open(ctx, j.state, redisaudit.Options{Logger: deps.Logger})
	if err != nil {
		return nil, fmt.Errorf("audit in redis: %w", err)
	}
	deps.AuditTarget = t
	return func() {
		if err := t.Close(); err != nil {
			deps.Logger.Warn("closing the audit's redis client", "err", err)
		}
	}, nil
}

// outputLabel says where survivors go, for the start log line: the topic,
// stdout or the table.
func (j *job) outputLabel(out pubsubio.Name) string {
	switch kind, _ := sinkKind(j.sink); kind {
	case sinkPubSub:
		return out.String()
	case sinkPostgres:
		if j.table == "" {
			return "table " + postgres.DefaultTable
		}
		return "table " + j.table
	}
	return "stdout"
}

// project picks the client's project: the flag, or the input's.
func (j *job) clientProject(in pubsubio.Name) string {
	if j.project != "" {
		return j.project
	}
	return in.Project
}

func runPipeline(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var j job
	var lf logFlags
	fs := newFlags("pipeline", stderr)
	j.register(fs)
	lf.register(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	j.given = given(fs)
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	// Every flag is checked before the client connects: a mistake should
	// not first show up as a Pub/Sub credentials error.
	in, _, _, _, err := j.names()
	if err != nil {
		return err
	}
	if _, _, err := j.config(); err != nil {
		return err
	}
	j.stdout = stdout
	c, err := pubsubio.NewClient(ctx, j.clientProject(in))
	if err != nil {
		return err
	}
	defer c.Close()
	return j.run(ctx, c, log, nil)
}

// run wires and runs the pipeline until ctx is done. started, if set, gets
// the pipeline once it receives.
func (j *job) run(ctx context.Context, c *pubsub.Client, log *slog.Logger, started func(*pipeline.Pipeline)) error {
	in, out, dlName, fromTopic, err := j.names()
	if err != nil {
		return err
	}
	cfg, opt, err := j.config()
	if err != nil {
		return err
	}
	if err := checkResources(ctx, c, in, out, dlName, fromTopic); err != nil {
		return err
	}
	st, closeStore, err := openState(ctx, j.state, j.horizon, j.timeDomain == "event", log)
	if err != nil {
		return err
	}
	defer closeStore()
	opt.Now = time.Now
	dd, err := dedup.New(st, opt)
	if err != nil {
		return err
	}
	cfg.WriteTimeout = dd.Lease() / 2
	sink, closeSink, err := openSink(ctx, sinkSpec{spec: j.sink, table: j.table, onConflict: j.onConflict, stdout: j.stdout, client: c, topic: out, timeout: cfg.WriteTimeout, log: log})
	if err != nil {
		return err
	}
	defer closeSink()
	deps := pipeline.Deps{Deduper: dd, Sink: sink, Logger: log, Now: time.Now}
	if dlName.ID != "" {
		dl := topic.New(c, dlName, cfg.WriteTimeout)
		defer dl.Stop()
		deps.DeadLetter = dl
	}
	closeAudit, err := j.auditTarget(ctx, cfg, &deps)
	if err != nil {
		return err
	}
	defer closeAudit()
	if l, ok := st.(interface{ Len() int }); ok {
		deps.HorizonKeys = l.Len
	}
	reg := prometheus.NewRegistry()
	deps.Registerer = reg
	p, err := pipeline.New(cfg, deps)
	if err != nil {
		return err
	}
	if j.metricsAddr != "" {
		stopMetrics, err := serveMetrics(ctx, j.metricsAddr, reg, p.Ready, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}

	subName := in
	if fromTopic {
		subName, err = pubsubio.TempSubscription(ctx, c, in, 60)
		if err != nil {
			return err
		}
		log.Info("reading topic through a subscription of our own", "topic", in.String(), "subscription", subName.String())
		defer func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := pubsubio.DeleteSubscription(dctx, c, subName); err != nil {
				log.Warn("could not remove our subscription", "subscription", subName.String(), "err", err)
			}
		}()
	}
	sub := c.Subscriber(subName.String())
	sub.ReceiveSettings.MaxOutstandingMessages = j.maxOutstanding
	sub.ReceiveSettings.NumGoroutines = 2
	log.Info("pipeline running", "input", subName.String(), "sink", sinkLabel(j.sink), "output", j.outputLabel(out),
		"id_attribute", cfg.Rule.IDAttribute, "horizon", opt.Horizon.String(), "state", j.state, "shadow", cfg.Shadow)
	if started != nil {
		started(p)
	}
	err = p.Run(ctx, sub)
	c2 := p.Counts()
	log.Info("pipeline stopped", "received", c2.Received, "emitted", c2.Emitted,
		"redeliveries", c2.DuplicateRedelivery, "republishes", c2.DuplicateRepublish,
		"dead_lettered", c2.DeadLettered, "missing_id", c2.MissingID)
	return err
}
