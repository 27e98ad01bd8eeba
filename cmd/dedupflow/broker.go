package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/console/brokerpage"
)

// brokerConfig is what `dedupflow broker` is told.
type brokerConfig struct {
	listen  string
	dataDir string
	noSync  bool
	verbose bool
	log     logFlags
	// Created before the broker serves.
	project    string
	topics     listFlag
	subs       listFlag // TOPIC:SUBSCRIPTION, checked by Set
	bootstrap  string
	allowHosts listFlag
	console    string
	// metricsAddr serves /metrics, /healthz and /readyz; empty: off.
	metricsAddr string
}

// listFlag is a flag that repeats; each value may also be a comma-separated
// list, so that one DEDUPFLOW_* variable can name several (IDs hold no
// commas). check, when set, vets each value, so that a bad one is reported
// with the flag or variable it came from.
type listFlag struct {
	vals  []string
	check func(string) error
}

func (l *listFlag) String() string { return strings.Join(l.vals, ",") }

func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if l.check != nil {
			if err := l.check(s); err != nil {
				return err
			}
		}
		l.vals = append(l.vals, s)
	}
	return nil
}

func topicAndSub(v string) (topic, sub string, err error) {
	topic, sub, ok := strings.Cut(v, ":")
	if !ok || topic == "" || sub == "" {
		return "", "", fmt.Errorf("%q: want TOPIC:SUBSCRIPTION", v)
	}
	return topic, sub, nil
}

func (b *brokerConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&b.listen, "listen", "127.0.0.1:8085", "`host:port` to serve gRPC and the REST API on (port 0 picks a free one)")
	fs.StringVar(&b.console, "console", "", "`host:port` to serve the broker's web page on, at /broker (off when empty; give a loopback address unless others should reach it)")
	fs.StringVar(&b.metricsAddr, "metrics-addr", "", "`host:port` to serve /metrics (per-subscription backlog and the process's own), /healthz and /readyz on (off when empty)")
	fs.Var(&b.allowHosts, "allow-host", "host `name`, besides localhost and IP addresses, under which the REST API may be called (repeats; other names are refused, against DNS rebinding)")
	fs.StringVar(&b.dataDir, "data-dir", "", "`dir`ectory that makes topics, subscriptions and unacknowledged messages durable; empty keeps everything in memory")
	fs.BoolVar(&b.noSync, "no-sync", false, "with --data-dir, skip fsync: messages survive the process dying, not a power loss")
	fs.BoolVar(&b.verbose, "v", false, "log debug messages (as --log-level debug)")
	b.log.register(fs)
	fs.StringVar(&b.project, "project", "", "project of short IDs in --topic, --subscription and --bootstrap")
	b.subs.check = func(v string) error { _, _, err := topicAndSub(v); return err }
	fs.Var(&b.topics, "topic", "`topic` to create before serving (repeats; ID or projects/P/topics/T)")
	fs.Var(&b.subs, "subscription", "`topic:subscription` to create before serving, with the topic (repeats)")
	fs.StringVar(&b.bootstrap, "bootstrap", "", "YAML or JSON `file` of Pub/Sub REST API Topic and Subscription resources to create before serving")
}

// resources gathers what the flags and the bootstrap file ask for.
func (b *brokerConfig) resources() (*broker.Resources, error) {
	r := &broker.Resources{}
	if b.bootstrap != "" {
		data, err := os.ReadFile(b.bootstrap)
		if err != nil {
			return nil, fmt.Errorf("--bootstrap: %w", err)
		}
		if r, err = broker.ParseResources(data, b.project); err != nil {
			return nil, fmt.Errorf("--bootstrap %s: %w", b.bootstrap, err)
		}
	}
	fr := &broker.Resources{}
	for _, t := range b.topics.vals {
		fr.Topics = append(fr.Topics, &pb.Topic{Name: t})
	}
	for _, ts := range b.subs.vals {
		t, s, err := topicAndSub(ts)
		if err != nil {
			return nil, err
		}
		fr.Topics = append(fr.Topics, &pb.Topic{Name: t})
		fr.Subscriptions = append(fr.Subscriptions, &pb.Subscription{Name: s, Topic: t})
	}
	if err := fr.Qualify(b.project); err != nil {
		return nil, fmt.Errorf("--topic/--subscription: %w", err)
	}
	r.Topics = appendNew(r.Topics, fr.Topics...)
	r.Subscriptions = append(r.Subscriptions, fr.Subscriptions...)
	return r, nil
}

// appendNew appends the topics not already named, so that --subscription
// T:S after --topic T, or T from the file, asks for T once.
func appendNew(have []*pb.Topic, more ...*pb.Topic) []*pb.Topic {
	for _, t := range more {
		if !slices.ContainsFunc(have, func(h *pb.Topic) bool { return h.Name == t.Name }) {
			have = append(have, t)
		}
	}
	return have
}

// runBroker serves a Pub/Sub-compatible broker until ctx is cancelled
// (SIGINT/SIGTERM), then shuts it down gracefully.
func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var cfg brokerConfig
	fs := newFlags("broker", stderr)
	defer func() { err = envNamed(fs, err) }()
	cfg.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dedupflow broker [--listen host:port] [--data-dir DIR] [--no-sync] [-v] [--allow-host NAME]... [--console host:port]")
		fmt.Fprintln(stderr, "         [--metrics-addr host:port]")
		fmt.Fprintln(stderr, "         [--project P] [--topic T]... [--subscription T:S]... [--bootstrap FILE]")
		fmt.Fprintln(stderr, "\nServes the google.pubsub.v1 API over gRPC and REST on one port; point clients at it with")
		fmt.Fprintln(stderr, "PUBSUB_EMULATOR_HOST, gcloud with CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB=http://host:port/.")
		fmt.Fprintln(stderr, "Topics and subscriptions the flags and the file name exist before it serves; one that")
		fmt.Fprintln(stderr, "exists already must have the same configuration.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.verbose {
		cfg.log.level = "debug"
	}
	log, err := cfg.log.logger(stderr)
	if err != nil {
		return err
	}
	res, err := cfg.resources()
	if err != nil {
		return err
	}

	if err := checkPorts([][2]string{{"--listen", cfg.listen}, {"--console", cfg.console}, {"--metrics-addr", cfg.metricsAddr}}); err != nil {
		return err
	}
	b, err := broker.New(broker.Options{DataDir: cfg.dataDir, NoSync: cfg.noSync, Logger: log, Now: time.Now, AllowedHosts: cfg.allowHosts.vals,
		Exports: broker.ExportOptionsFromEnv(os.Getenv)})
	if err != nil {
		return err
	}
	if err := b.Ensure(ctx, res); err != nil {
		b.Close()
		return err
	}
	if n := len(res.Topics) + len(res.Subscriptions); n > 0 {
		log.Info("topics and subscriptions ready", "topics", len(res.Topics), "subscriptions", len(res.Subscriptions))
	}
	addr, err := b.Listen(cfg.listen)
	if err != nil {
		b.Close()
		return err
	}
	durability := "in memory"
	if cfg.dataDir != "" {
		durability = "data in " + cfg.dataDir
		if cfg.noSync {
			durability += " (no fsync)"
		}
	}
	log.Info("broker listening", "addr", addr, "durability", durability)
	warnOpen(log, "broker", addr)
	fmt.Fprintf(stdout, "export PUBSUB_EMULATOR_HOST=%s\n", dialable(addr))

	var stops []func()
	defer func() {
		for _, stop := range stops {
			stop()
		}
	}()
	for _, srv := range []struct {
		addr  string
		serve func() (func(), error)
	}{
		{cfg.console, func() (func(), error) { return serveBrokerPage(ctx, b, cfg, log, stdout) }},
		{cfg.metricsAddr, func() (func(), error) { return serveBrokerMetrics(ctx, b, cfg.metricsAddr, log) }},
	} {
		if srv.addr == "" {
			continue
		}
		stop, err := srv.serve()
		if err != nil {
			b.Close()
			return err
		}
		stops = append(stops, stop)
	}
	<-ctx.Done()
	log.Info("broker shutting down")
	for _, stop := range stops {
		stop()
	}
	stops = nil
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	return b.Shutdown(sctx)
}

// serveBrokerPage serves the broker's web page on --console until stop.
func serveBrokerPage(ctx context.Context, b *broker.Broker, cfg brokerConfig, log *slog.Logger, stdout io.Writer) (stop func(), err error) {
	h, err := brokerpage.New(b, brokerpage.Options{AllowedHosts: cfg.allowHosts.vals, Logger: log.With("component", "console")})
	if err != nil {
		return nil, err
	}
	at, stop, err := serveHTTP(ctx, "--console", cfg.console, h, log)
	if err != nil {
		return nil, err
	}
	warnOpen(log, "broker page", at)
	fmt.Fprintf(stdout, "# broker page: http://%s/broker\n", dialable(at))
	return stop, nil
}

// serveBrokerMetrics serves the broker's /metrics, /healthz and /readyz
// on --metrics-addr until stop.
func serveBrokerMetrics(ctx context.Context, b *broker.Broker, addr string, log *slog.Logger) (stop func(), err error) {
	reg := newRegistry()
	reg.MustRegister(brokerCollector{b})
	mux := metricsMux(reg, func() bool { return ctx.Err() == nil }, "not ready: the broker is shutting down")
	at, stop, err := serveHTTP(ctx, "--metrics-addr", addr, mux, log)
	if err != nil {
		return nil, err
	}
	log.Info("metrics and health", "url", "http://"+at+"/metrics")
	return stop, nil
}
