package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/console"
	"github.com/dedupflow/dedupflow/console/brokerpage"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// The tutorial's resource names.
const (
	upInputTopic   = "topicToDataflow"
	upOutputTopic  = "topicFromDataflow"
	upConsumerSub  = "topicFromDataflow.subscriptionFromDataflow"
	upPipelineSub  = "topicToDataflow.dedupflow"
	upConsoleSub   = "topicFromDataflow.console"
	upBigQuerySub  = "topicFromDataflow.bigquery"
	upDeadLetters  = "deadLetters"
	upDeadLetSub   = "deadLetters.subscription"
	upDefaultProj  = "dedupflow-demo"
	upShutdownWait = 5 * time.Second
)

// upFlags are what `dedupflow up` is told.
type upFlags struct {
	job           jobFlags
	brokerAddr    string
	consoleAddr   string
	bigqueryTable string
}

func (u *upFlags) register(fs *flag.FlagSet) {
	// The pipeline flags that mean the same here, under the same names.
	j := &u.job
	fs.StringVar(&j.names.project, "project", upDefaultProj, "project the broker's topics and subscriptions live in")
	fs.StringVar(&j.key.idAttr, "id-attribute", publisher.DefaultIDAttribute, "attribute holding the publisher's stable key; the console's key goes there, and publish and loadgen stamp it by default")
	fs.StringVar(&j.time.tsAttr, "timestamp-attribute", "", "attribute holding the event time for the horizon (empty: the publish time)")
	durationVar(fs, &j.time.horizon, "horizon", dedup.DefaultHorizon, "how long a key is remembered, from first sight")
	j.audit.register(fs)
	fs.StringVar(&j.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz (empty: off)")
	fs.StringVar(&u.brokerAddr, "broker-addr", "127.0.0.1:8085", "address of the Pub/Sub-compatible broker, for other clients to join")
	fs.StringVar(&u.consoleAddr, "console-addr", "127.0.0.1:8080", "address of the web console")
	fs.StringVar(&j.sink.spec, "sink", sinkPubSub, "where survivors go: pubsub (the topic "+upOutputTopic+", which the console shows), postgres://…, bigquery://PROJECT/DATASET, spanner://projects/P/instances/I/databases/D or bigtable://projects/P/instances/I (see --table)")
	fs.StringVar(&j.sink.table, "table", "events", "table of a database sink (bigquery, spanner, bigtable: it must exist)")
	j.sink.registerColumns(fs)
	fs.StringVar(&u.bigqueryTable, "bigquery-table", "", "PROJECT.DATASET.TABLE that a BigQuery subscription on "+upOutputTopic+
		" fills with the deduped messages (columns data, subscription_name, message_id, publish_time, attributes), through the BigQuery emulator at $BIGQUERY_EMULATOR_HOST and $BIGQUERY_STORAGE_EMULATOR_HOST (empty: none)")
}

// config fixes what up decides itself and checks the rest; getenv
// reads where the broker's export destinations are.
func (u *upFlags) config(getenv func(string) string) (upConfig, error) {
	j := &u.job
	if j.key.idAttr == "" {
		return upConfig{}, errors.New("--id-attribute must not be empty: the console publishes the form's key in it")
	}
	exports := broker.ExportOptionsFromEnv(getenv)
	if u.bigqueryTable != "" {
		// The subscription would only show NOT_FOUND: up has no Google
		// Cloud to fall back on.
		if !exports.BigQuery.Emulated() {
			return upConfig{}, fmt.Errorf("--bigquery-table needs the BigQuery emulator: set $%s and $%s to its HTTP and gRPC ports",
				bigquery.EnvREST, bigquery.EnvStorage)
		}
		if err := exports.BigQuery.Check(); err != nil {
			return upConfig{}, fmt.Errorf("--bigquery-table: %w", err)
		}
	}
	// Everything lives in memory, the horizon too: the broker's message IDs
	// start again with each run, so a horizon kept across runs would take
	// new messages for redeliveries of old ones.
	j.state = "mem"
	j.names.inSub = upPipelineSub
	// A message the pipeline cannot use (a malformed timestamp, a row its
	// table refuses) goes aside with the reason, as it should in
	// production, instead of coming back for ever.
	j.names.deadLetter = upDeadLetters
	if j.sink.spec == sinkPubSub {
		j.names.outTopic = upOutputTopic
	}
	j.key.missing, j.maxOutstanding, j.maxBytes = "fallback", 1000, defaultMaxBytes
	cfg, err := j.config()
	return upConfig{job: cfg, brokerAddr: u.brokerAddr, consoleAddr: u.consoleAddr, bigqueryTable: u.bigqueryTable, exports: exports}, err
}

// upConfig is a checked `dedupflow up`.
type upConfig struct {
	job           jobConfig
	brokerAddr    string
	consoleAddr   string
	bigqueryTable string
	exports       broker.ExportOptions
}

// The tutorial that up runs, as Google Cloud published it.
const (
	tutorialTitle = "Deduplicate Pub/Sub messages with Dataflow in a Spring Cloud Stream application"
	tutorialURL   = "https://cloud.google.com/community/tutorials/pubsub-spring-dedup-messages"
)

// runUp is the tutorial as one command: broker, topics, dedup pipeline
// and web console, until interrupted.
func runUp(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		u  upFlags
		lf logFlags
	)
	fs := newFlags("up", stderr)
	defer func() { err = envNamed(fs, err) }()
	u.register(fs)
	lf.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: dedupflow up [flags]\n\n"+
			"Runs Google Cloud's tutorial %q\n(%s)\n"+
			"on this machine, without Dataflow or a Google Cloud project: a Pub/Sub-compatible\n"+
			"broker with the topics %s and %s and the subscription\n%s, the dedup pipeline between the topics,\n"+
			"and a web console to publish with a key and watch duplicates collapse.\n\n",
			tutorialTitle, tutorialURL, upInputTopic, upOutputTopic, upConsumerSub)
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	// Check every flag before anything starts listening.
	u.job.given = given(fs)
	cfg, err := u.config(os.Getenv)
	if err != nil {
		return err
	}
	return cfg.run(ctx, log, stdout)
}

func (u *upConfig) run(ctx context.Context, log *slog.Logger, stdout io.Writer) (err error) {
	if err := checkPorts([][2]string{{"--console-addr", u.consoleAddr}, {"--broker-addr", u.brokerAddr}, {"--metrics-addr", u.job.metricsAddr}}); err != nil {
		return err
	}
	// The console's port first: when it is taken, up fails before the
	// broker serves, so there is no server to stop and nothing to log
	// beside the error (a broker stopped before its server got going
	// logged "grpc server stopped" as an error).
	ln, err := net.Listen("tcp", u.consoleAddr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("--console-addr %s: %w (is another dedupflow up running? pick another with --console-addr)", u.consoleAddr, err)
		}
		return fmt.Errorf("--console-addr %s: %w", u.consoleAddr, err)
	}
	defer ln.Close() // for the early returns; Serve closes it otherwise
	b, err := broker.New(broker.Options{Logger: log.With("component", "broker"), Exports: u.exports})
	if err != nil {
		return err
	}
	// Ctrl-C lets unary calls in flight finish, then the broker goes.
	defer func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), upShutdownWait)
		defer cancel()
		if serr := b.Shutdown(sctx); serr != nil && err == nil {
			err = fmt.Errorf("stop broker: %w", serr)
		}
	}()
	brokerAddr, err := b.Listen(u.brokerAddr)
	if err != nil {
		return fmt.Errorf("--broker-addr: %w", err)
	}
	warnOpen(log, "broker", brokerAddr)
	warnOpen(log, "console", ln.Addr().String())

	brokerAddr = dialable(brokerAddr)
	c, err := pubsubio.NewClient(ctx, u.job.project, pubsubio.Insecure(brokerAddr)...)
	if err != nil {
		return err
	}
	defer c.Close()
	n, err := u.createResources(ctx, c)
	if err != nil {
		return err
	}

	// The console shows the pipeline's counters once it exists.
	var (
		pmu sync.Mutex
		p   *pipeline.Pipeline
	)
	bpage, err := brokerpage.New(b, brokerpage.Options{ConsoleURL: "/", Logger: log.With("component", "console")})
	if err != nil {
		return err
	}
	con, err := console.New(console.Options{
		BrokerPage:           bpage,
		Client:               c,
		InputTopic:           n.in,
		PipelineSubscription: n.pipelineSub,
		OutputTopic:          n.out,
		OutputSubscription:   n.consoleSub,
		Destination:          u.destination(),
		IDAttribute:          u.job.pipeline.IDAttribute,
		EventTimeAttribute:   u.job.pipeline.TimestampAttribute,
		Horizon:              u.job.pipeline.Horizon,
		Counts: func() pipeline.Counts {
			pmu.Lock()
			defer pmu.Unlock()
			if p == nil {
				return pipeline.Counts{}
			}
			return p.Counts()
		},
		Advice: func() string {
			pmu.Lock()
			defer pmu.Unlock()
			if p == nil {
				return ""
			}
			return p.Advice()
		},
		Logger: log.With("component", "console"),
	})
	if err != nil {
		return err
	}

	var banner sync.Once
	consoleURL := "http://" + dialable(ln.Addr().String())
	// One part failing stops the others.
	u.job.collectors = append(u.job.collectors, brokerCollector{b})
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return con.Serve(gctx, ln) })
	g.Go(func() error {
		e := runJob(gctx, &u.job, c, stdout, log, func(pp *pipeline.Pipeline) {
			pmu.Lock()
			p = pp
			pmu.Unlock()
			banner.Do(func() { u.printBanner(stdout, consoleURL, brokerAddr) })
		})
		if e == nil && gctx.Err() == nil {
			e = errors.New("pipeline stopped unexpectedly")
		}
		if e != nil {
			return fmt.Errorf("pipeline: %w", e)
		}
		return nil
	})
	err = g.Wait()
	log.Info("stopped", "console", consoleURL, "broker", brokerAddr)
	return err
}

type upNames struct {
	in, out, consumerSub, pipelineSub, consoleSub pubsubio.Name
	deadLetters, deadLetSub                       pubsubio.Name
}

// createResources creates the tutorial's topics and subscription, the
// pipeline's subscription and the console's.
func (u *upConfig) createResources(ctx context.Context, c *pubsub.Client) (upNames, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	proj := u.job.project
	n := upNames{
		in:          pubsubio.Name{Project: proj, Kind: "topics", ID: upInputTopic},
		out:         pubsubio.Name{Project: proj, Kind: "topics", ID: upOutputTopic},
		consumerSub: pubsubio.Name{Project: proj, Kind: "subscriptions", ID: upConsumerSub},
		pipelineSub: pubsubio.Name{Project: proj, Kind: "subscriptions", ID: upPipelineSub},
		consoleSub:  pubsubio.Name{Project: proj, Kind: "subscriptions", ID: upConsoleSub},
		deadLetters: pubsubio.Name{Project: proj, Kind: "topics", ID: upDeadLetters},
		deadLetSub:  pubsubio.Name{Project: proj, Kind: "subscriptions", ID: upDeadLetSub},
	}
	for _, t := range []pubsubio.Name{n.in, n.out, n.deadLetters} {
		if err := pubsubio.EnsureTopic(ctx, c, t); err != nil {
			return n, err
		}
	}
	// The pipeline's subscription keeps acknowledged messages, so the
	// console can seek it back and act out a redelivery. A retention as
	// long as the horizon (at least an hour) covers every replay that can
	// still be a duplicate.
	retention := max(time.Hour, u.job.pipeline.Horizon)
	_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: n.pipelineSub.String(), Topic: n.in.String(), AckDeadlineSeconds: 60,
		RetainAckedMessages: true, MessageRetentionDuration: durationpb.New(min(retention, 7*24*time.Hour)),
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return n, fmt.Errorf("create subscription %s: %w", n.pipelineSub, err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, n.consumerSub, n.out, 10); err != nil {
		return n, err
	}
	if err := pubsubio.EnsureSubscription(ctx, c, n.consoleSub, n.out, 10); err != nil {
		return n, err
	}
	// A topic without a subscription drops what is published to it.
	if err := pubsubio.EnsureSubscription(ctx, c, n.deadLetSub, n.deadLetters, 10); err != nil {
		return n, err
	}
	if u.bigqueryTable != "" {
		bq := pubsubio.Name{Project: proj, Kind: "subscriptions", ID: upBigQuerySub}
		_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
			Name: bq.String(), Topic: n.out.String(), AckDeadlineSeconds: 60,
			BigqueryConfig: &pubsubpb.BigQueryConfig{Table: u.bigqueryTable, WriteMetadata: true},
		})
		if err != nil {
			return n, fmt.Errorf("--bigquery-table: create subscription %s: %w", bq, err)
		}
	}
	return n, nil
}

// destination is where survivors go, as the banner and the console name
// it: the tutorial's output topic, or the table of --sink.
func (u *upConfig) destination() string {
	if u.job.sink.kind == sinkPubSub {
		return ""
	}
	return u.job.outputLabel() + " of --sink " + sinkLabel(u.job.sink.url)
}

// printBanner says where everything is. Its publish command names the id
// attribute only when up was given another than the one publish stamps by
// default.
func (u *upConfig) printBanner(w io.Writer, consoleURL, brokerAddr string) {
	project, idAttr := u.job.project, u.job.pipeline.IDAttribute
	idFlag := ""
	if idAttr != publisher.DefaultIDAttribute {
		idFlag = " --id-attribute " + shellWord(idAttr)
	}
	out, read := upOutputTopic, fmt.Sprintf(`  Read what comes through, as the tutorial's app does:
    dedupflow subscribe --project %s --subscription %s
`, project, upConsumerSub)
	if dest := u.destination(); dest != "" {
		out = u.job.outputLabel()
		read = fmt.Sprintf("  Survivors go to %s;\n  nothing reaches %s.\n", dest, upOutputTopic)
	}
	fmt.Fprintf(w, `dedupflow is up: %s -> dedup pipeline -> %s

  Console:  %s

  Broker:   %s (project %s). Point other Pub/Sub clients at it:
    export PUBSUB_EMULATOR_HOST=%s
    (Spring: spring.cloud.gcp.pubsub.emulator-host=%s)

  Publish one event three times, as a producer retrying after lost
  responses (the pipeline dedups on attribute %s):
    dedupflow publish --project %s --topic %s%s --key 456 --copies 3 --data 'Message 2'

%s
  Messages the pipeline cannot use go to %s, with the reason:
    dedupflow subscribe --project %s --subscription %s

Press Ctrl-C to stop.
`, upInputTopic, out, consoleURL, brokerAddr, project, brokerAddr, brokerAddr,
		idAttr, project, upInputTopic, idFlag, read,
		upDeadLetters, project, upDeadLetSub)
}

// shellWord quotes s for a POSIX shell unless it is a plain word.
func shellWord(s string) string {
	if s != "" && !strings.ContainsFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("_-.:/=@%+,", r))
	}) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// dialable turns a listening address into one a local client can dial:
// a wildcard host (0.0.0.0, ::) becomes 127.0.0.1.
func dialable(hostport string) string {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return hostport
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		return net.JoinHostPort("127.0.0.1", port)
	}
	return hostport
}

// openWarnings say what anyone who reaches a server without
// authentication can do, for the warning at start.
var openWarnings = map[string]string{
	"broker":        "anyone who can reach it can publish, pull, and create or delete topics and subscriptions through the gRPC and REST API",
	"console":       "anyone who can reach it can publish",
	"broker page":   "anyone who can reach it can publish and seek",
	"push endpoint": "anyone who can reach it can post messages that the pipeline takes as pushed by Pub/Sub; give --push-audience and --push-service-account to verify the push subscription's token",
}

// warnOpen warns when a server that does not ask who is calling listens
// at hostport (as Listen returned it) beyond loopback.
func warnOpen(log *slog.Logger, component, hostport string) {
	ap, err := netip.ParseAddrPort(hostport)
	if err != nil || ap.Addr().Unmap().IsLoopback() {
		return
	}
	log.Warn("listening beyond loopback, without authentication: "+openWarnings[component], "component", component, "addr", hostport)
}
