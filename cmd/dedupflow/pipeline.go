package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/audit/redisaudit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/pushauth"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/pubsubio/pull"
	"github.com/dedupflow/dedupflow/sink/topic"
)

func runPipeline(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		j  jobFlags
		lf logFlags
	)
	fs := newFlags("pipeline", stderr)
	defer func() { err = envNamed(fs, err) }()
	j.register(fs)
	lf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: dedupflow pipeline (--input-subscription S | --input-topic T) (--output-topic T2 | --sink KIND) [flags]\n\n"+
			"Dedups a subscription (or a topic) into a topic, a database or stdout. It also takes the\n"+
			"Beam options of a Dataflow job: --inputTopic=, --inputSubscription=, --outputTopic=,\n"+
			"--idAttribute=, --timestampAttribute= and --runner= (dedupflow is the runner).\n\n")
		fs.PrintDefaults()
	}
	args, notice, err := beamArgs(fs, args)
	if err != nil {
		return err
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	j.given = given(fs)
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if notice != "" {
		log.Info(notice)
	}
	cfg, err := j.config()
	if err != nil {
		return err
	}
	if cfg.pipeline.IDAttribute == "" && cfg.pipeline.From == dedup.KeyFromAttribute {
		// Said at start: otherwise a user learns it from duplicates in the output.
		log.Info(fmt.Sprintf("no --id-attribute: redeliveries are dropped by message ID, republished copies pass; publish and loadgen stamp their key in %q (--id-attribute %s)",
			publisher.DefaultIDAttribute, publisher.DefaultIDAttribute))
	}
	c, err := pubsubio.NewClient(ctx, cfg.project)
	if err != nil {
		return err
	}
	defer c.Close()
	return runJob(ctx, &cfg, c, stdout, log, nil)
}

// runJob wires and runs the pipeline until ctx is done; --sink stdout
// writes to stdout. started, if set, gets the pipeline once it receives.
func runJob(ctx context.Context, cfg *jobConfig, c *pubsub.Client, stdout io.Writer, log *slog.Logger, started func(*pipeline.Pipeline)) (err error) {
	if err := checkResources(ctx, c, cfg); err != nil {
		return err
	}
	var sub *pubsub.Subscriber // nil: pushes come in instead
	var subName string
	mlog := log
	if cfg.push.addr == "" {
		var removeSub func()
		var err error
		if sub, removeSub, err = subscriber(ctx, c, cfg, log); err != nil {
			return err
		}
		defer removeSub()
		// The pipeline's lines about a message name its subscription as a
		// field, as log pipelines expect beside message_id.
		subName = sub.String()
		mlog = log.With("subscription", subName)
	}
	st, closeStore, err := openState(ctx, cfg.state, cfg.pipeline.Policy, log)
	if err != nil {
		return err
	}
	defer func() { closeStore(err != nil) }()
	pc := cfg.pipeline
	if err := pc.Validate(); err != nil { // fills the write timeout the sinks are opened with
		return err
	}
	sink, closeSink, err := openSink(ctx, cfg.sink, sinkWiring{client: c, topic: cfg.out, timeout: pc.WriteTimeout, stdout: stdout, sub: subName, log: log})
	if err != nil {
		return err
	}
	defer closeSink()
	deps := pipeline.Deps{Store: st, Sink: sink, Logger: mlog, Now: time.Now}
	if cfg.deadLetter.ID != "" {
		dl := topic.New(c, cfg.deadLetter, pc.WriteTimeout)
		defer dl.Stop()
		deps.DeadLetter = dl
	}
	if pc.Audit.Horizon > 0 && cfg.state.redis {
		closeAudit, err := auditInRedis(ctx, cfg.state, &deps)
		if err != nil {
			return err
		}
		defer closeAudit()
	}
	if l, ok := st.(interface{ Len() int }); ok {
		deps.HorizonKeys = l.Len
	}
	reg := newRegistry()
	reg.MustRegister(cfg.collectors...)
	deps.Registerer = reg
	p, err := pipeline.New(pc, deps)
	if err != nil {
		return err
	}
	if cfg.metricsAddr != "" {
		stopMetrics, err := serveMetrics(ctx, cfg.metricsAddr, reg, p.Ready, log)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}
	if cfg.push.addr != "" {
		err = servePush(ctx, p, cfg, log, started)
	} else {
		err = pullInput(ctx, c, p, sub, cfg, log, started)
	}
	n := p.Counts()
	log.Info("pipeline stopped", "received", n.Received, "emitted", n.Emitted,
		"redeliveries", n.DuplicateRedelivery, "republishes", n.DuplicateRepublish,
		"dead_lettered", n.DeadLettered, "missing_id", n.MissingID)
	return err
}

// pullInput runs p on the input subscription, through the receiver
// --receiver names.
func pullInput(ctx context.Context, c *pubsub.Client, p *pipeline.Pipeline, sub *pubsub.Subscriber, cfg *jobConfig, log *slog.Logger, started func(*pipeline.Pipeline)) error {
	log.Info("pipeline running", "input", sub.String(), "sink", sinkLabel(cfg.sink.url), "output", cfg.outputLabel(),
		"id_attribute", cfg.pipeline.IDAttribute, "horizon", cfg.pipeline.Horizon.String(), "horizon_mode", cfg.pipeline.HorizonMode.String(),
		"state", redact.URL(cfg.state.spec), "shadow", cfg.pipeline.Shadow)
	if started != nil {
		started(p)
	}
	if cfg.receive.receiver == "batch" {
		in, err := pull.New(c.SubscriptionAdminClient, sub.String(), pull.Options{Streams: cfg.receive.streams,
			MaxOutstanding: cfg.maxOutstanding, MaxOutstandingBytes: int64(cfg.maxBytes), BatchWait: cfg.receive.batchWait, Logger: log})
		if err != nil {
			return err
		}
		return p.RunBatch(ctx, in)
	}
	return p.Run(ctx, pubsubio.StopWithin(sub, stopGrace))
}

// servePush runs p as the endpoint of a push subscription.
func servePush(ctx context.Context, p *pipeline.Pipeline, cfg *jobConfig, log *slog.Logger, started func(*pipeline.Pipeline)) error {
	ln, err := net.Listen("tcp", cfg.push.addr)
	if err != nil {
		return fmt.Errorf("--input-push: %w", err)
	}
	// A wildcard address is no place to send pushes: name the loopback.
	endpoint := "http://" + dialable(ln.Addr().String()) + cfg.push.path
	o := pipeline.PushOptions{Path: cfg.push.path}
	if a := cfg.push; a.audience != "" {
		if o.Verify, err = pushauth.New(ctx, pushauth.Options{JWKS: a.jwks, Audience: a.audience, ServiceAccount: a.serviceAccount}); err != nil {
			return err
		}
		log.Info("push tokens verified", "audience", a.audience, "service_account", a.serviceAccount, "jwks", redact.URL(a.jwks))
	} else {
		warnOpen(log, "push endpoint", ln.Addr().String())
	}
	log.Info("pipeline running", "push_endpoint", endpoint,
		"configure", "set the push subscription's endpoint to push_endpoint (on Cloud Run: the service's https URL with this path)", "sink", sinkLabel(cfg.sink.url), "output", cfg.outputLabel(),
		"id_attribute", cfg.pipeline.IDAttribute, "horizon", cfg.pipeline.Horizon.String(), "horizon_mode", cfg.pipeline.HorizonMode.String(),
		"state", redact.URL(cfg.state.spec))
	if started != nil {
		started(p)
	}
	return p.ServePush(ctx, ln, o)
}

// subscriber reads the input: its subscription, or one of our own on its
// topic, which remove deletes.
func subscriber(ctx context.Context, c *pubsub.Client, cfg *jobConfig, log *slog.Logger) (sub *pubsub.Subscriber, remove func(), err error) {
	name, remove := cfg.in, func() {}
	if cfg.fromTopic {
		name, err = pubsubio.TempSubscription(ctx, c, cfg.project, cfg.in, 60)
		if err != nil {
			return nil, nil, err
		}
		log.Info("reading topic through a subscription of our own", "topic", cfg.in.String(), "subscription", name.String())
		remove = func() {
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if err := pubsubio.DeleteSubscription(dctx, c, name); err != nil {
				log.Warn("could not remove our subscription", "subscription", name.String(), "err", err)
			}
		}
	}
	sub = c.Subscriber(name.String())
	sub.ReceiveSettings.MaxOutstandingMessages = cfg.maxOutstanding
	sub.ReceiveSettings.MaxOutstandingBytes = cfg.maxBytes
	sub.ReceiveSettings.NumGoroutines = cfg.receive.streams
	return sub, remove, nil
}

// auditInRedis keeps the audit in the Redis of the dedup store, so
// replicas pool it and it survives restarts (with file:PATH, the config
// names a snapshot file instead).
func auditInRedis(ctx context.Context, s stateSpec, deps *pipeline.Deps) (func(), error) {
	t, err := redisaudit.Open(ctx, s.spec, redisaudit.Options{Logger: deps.Logger})
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
