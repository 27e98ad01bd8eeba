package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/pushauth"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// jobFlags are a dedup pipeline's flags as given, shared by `pipeline` and
// `up`. config checks them and turns them into a jobConfig, once.
type jobFlags struct {
	names          nameFlags
	key            keyFlags
	time           timeFlags
	audit          auditFlags
	sink           sinkFlags
	state          string
	shadow         bool
	maxOutstanding int
	maxBytes       int
	metricsAddr    string
	push           pushFlags
	receive        receiveFlags
	given          map[string]bool // flags set on the command line or from the environment
}

// receiveFlags choose how a pulling pipeline receives: the official
// client's Receive, a message at a time, or the batch path (pubsubio/pull).
type receiveFlags struct {
	receiver  string
	streams   int
	batchWait time.Duration
}

// pushFlags make the pipeline a push endpoint instead of a puller; with
// audience and serviceAccount it takes only pushes whose OIDC token
// verifies against the keys at jwks.
type pushFlags struct{ addr, path, audience, serviceAccount, jwks string }

// defaultMaxBytes bounds the payloads held at once, so that the default
// pipeline stays under about 1 GiB even when every message is near
// Pub/Sub's 10 MB (with --receiver client, under it per stream).
const defaultMaxBytes = 400 << 20

// nameFlags name what is read and written.
type nameFlags struct{ project, inSub, inTopic, outTopic, deadLetter string }

// keyFlags say where a message's key is and what a missing one does.
type keyFlags struct{ idAttr, keyFrom, missing, producerAttr, outIDAttr string }

// timeFlags shape the horizon and its clock.
type timeFlags struct {
	horizon, lateness          time.Duration
	tsAttr, domain, late, mode string
}

// auditFlags size the audit filter of late duplicates.
type auditFlags struct {
	horizon  time.Duration
	fp       float64
	capacity uint
}

// sinkFlags are --sink and the flags of its kinds.
type sinkFlags struct{ spec, table, onConflict, metadata, fields, family, rowKey string }

func (j *jobFlags) register(fs *flag.FlagSet) {
	n, k, t, s := &j.names, &j.key, &j.time, &j.sink
	fs.StringVar(&n.project, "project", "", "Google Cloud project of short resource IDs")
	fs.StringVar(&n.inSub, "input-subscription", "", "subscription to read (ID or projects/P/subscriptions/S)")
	fs.StringVar(&n.inTopic, "input-topic", "", "topic to read through a subscription of our own, removed on exit")
	fs.StringVar(&n.outTopic, "output-topic", "", "topic the survivors are published to")
	fs.StringVar(&n.deadLetter, "dead-letter-topic", "", "topic for messages that cannot be processed, with the reason")
	fs.StringVar(&k.idAttr, "id-attribute", "", "attribute holding the publisher's stable key: \"key\" for publish, loadgen and up (empty: the message ID, which drops redeliveries only)")
	fs.StringVar(&t.tsAttr, "timestamp-attribute", "", "attribute holding the event time (ms since epoch or RFC 3339)")
	fs.StringVar(&k.producerAttr, "producer-attribute", "", "attribute naming the producer, to label missing-key counts")
	fs.StringVar(&k.outIDAttr, "output-id-attribute", "", "attribute carrying the key on outputs (default: --id-attribute, or dedupflow_id)")
	durationVar(fs, &t.horizon, "horizon", dedup.DefaultHorizon, "how long a key is remembered, from first sight")
	fs.StringVar(&t.mode, "horizon-mode", "fixed", "fixed (a key lives --horizon from first sight) or sliding (each caught copy keeps its key another --horizon)")
	fs.StringVar(&k.missing, "missing-id", "fallback", "a message without the id attribute: fallback (to the message ID), reject (dead-letter) or pass")
	fs.StringVar(&j.state, "state", "mem", "where the horizon lives: mem, file:PATH (survives restarts) or redis://host:port/db (shared by replicas)")
	fs.StringVar(&s.spec, "sink", "pubsub", "where survivors go: pubsub (the output topic), stdout (JSON lines), postgres://…, spanner://projects/P/instances/I/databases/D, bigtable://projects/P/instances/I or bigquery://PROJECT/DATASET (see --table)")
	fs.StringVar(&s.table, "table", "events", "table of a database sink (spanner, bigtable, bigquery: it must exist)")
	fs.StringVar(&s.onConflict, "on-conflict", "nothing", "database sink, key already written: nothing (keep the first row) or update (last write wins)")
	s.registerColumns(fs)
	fs.BoolVar(&j.shadow, "shadow", false, "decide and count duplicates but emit every message")
	fs.IntVar(&j.maxOutstanding, "max-outstanding", 4000, "messages held at once, received and not yet acked or nacked, across all --streams (split between them; each batch is acked in one request as soon as it is settled); with --receiver client, per stream")
	fs.IntVar(&j.maxBytes, "max-outstanding-bytes", defaultMaxBytes, "payload bytes held at once across all --streams (bounds memory with large messages); with --receiver client, per stream")
	fs.StringVar(&j.receive.receiver, "receiver", "batch", "how messages are pulled: batch (StreamingPull on the low-level client, a response at a time: one store call, one sink write and one ack request per batch) or client (the official client's Receive, one message at a time)")
	fs.IntVar(&j.receive.streams, "streams", 2, "StreamingPull streams to keep open")
	durationVar(fs, &j.receive.batchWait, "batch-wait", 0, "with --receiver batch: the longest a message waits for its batch to fill while the stream is idle (0: hand over at once what has arrived; under load messages gather while a batch is in work, so batches grow by themselves)")
	fs.StringVar(&j.push.addr, "input-push", "", "receive a push subscription's POSTs on this address (host:port) instead of pulling")
	fs.StringVar(&j.push.path, "push-path", "/", "with --input-push: the path Pub/Sub posts to")
	fs.StringVar(&j.push.audience, "push-audience", "", "with --input-push: take only pushes whose OIDC token has this audience (the push subscription's oidc_token audience; by default its endpoint URL); needs --push-service-account")
	fs.StringVar(&j.push.serviceAccount, "push-service-account", "", "with --input-push: take only pushes whose OIDC token is of this service account email (the push subscription's oidc_token service account); needs --push-audience")
	fs.StringVar(&j.push.jwks, "push-jwks", pushauth.GoogleCerts, "with --push-audience: URL of the keys that sign push tokens (the broker's: http://BROKER/oauth2/v3/certs)")
	fs.StringVar(&j.metricsAddr, "metrics-addr", "127.0.0.1:9464", "address of /metrics, /healthz and /readyz (empty: off)")
	fs.StringVar(&k.keyFrom, "key-from", "attribute", "where the key is: attribute (--id-attribute, else the message ID), json:PATH (a field of a JSON payload) or hash (SHA-256 of the payload)")
	fs.StringVar(&t.domain, "time-domain", "processing", "clock of the horizon: processing, or event (expires when the watermark passes event time + horizon)")
	durationVar(fs, &t.lateness, "allowed-lateness", time.Minute, "event time: how far the watermark trails the highest event time seen")
	fs.StringVar(&t.late, "late", "pass", "event time: a message too late to judge: pass (emit, counted) or dead-letter")
	j.audit.register(fs)
}

// register is shared with up, whose console advises --audit-horizon too.
func (a *auditFlags) register(fs *flag.FlagSet) {
	durationVar(fs, &a.horizon, "audit-horizon", 0, "remember keys this long (e.g. 7d), approximately, to mark copies after --horizon as probable late duplicates (default off)")
	fs.Float64Var(&a.fp, "audit-fp", audit.DefaultFalsePositive, "false-positive rate of the audit filter at --audit-capacity")
	fs.UintVar(&a.capacity, "audit-capacity", audit.DefaultCapacity, "distinct keys per --audit-horizon the audit filter is sized for (memory is fixed at start)")
}

// jobConfig is a checked pipeline: what it reads, how it dedups, where
// it writes.
type jobConfig struct {
	project        string // the client's, where our own subscription of --input-topic lives
	in             pubsubio.Name
	fromTopic      bool // in is a topic, read through a subscription of our own
	out            pubsubio.Name
	deadLetter     pubsubio.Name // ID empty: none
	pipeline       pipeline.Config
	state          stateSpec
	sink           sinkSpec
	maxOutstanding int
	maxBytes       int
	metricsAddr    string
	push           pushFlags // addr empty: pull
	receive        receiveFlags
	// collectors join the pipeline's on --metrics-addr: up adds its broker's.
	collectors []prometheus.Collector
}

// config checks every flag, before anything connects: a mistake should
// not first show up as a Pub/Sub credentials error.
func (j *jobFlags) config() (jobConfig, error) {
	var c jobConfig
	if err := j.resolveNames(&c); err != nil {
		return c, err
	}
	if err := j.keyConfig(&c); err != nil {
		return c, err
	}
	if j.maxOutstanding < 1 {
		return c, fmt.Errorf("--max-outstanding %d must be at least 1", j.maxOutstanding)
	}
	if j.maxBytes < 1 {
		return c, fmt.Errorf("--max-outstanding-bytes %d must be at least 1", j.maxBytes)
	}
	c.maxOutstanding, c.maxBytes, c.metricsAddr = j.maxOutstanding, j.maxBytes, j.metricsAddr
	if j.receive.receiver == "" { // up has no receive flags: its pipeline reads as the pipeline command's does by default
		j.receive = receiveFlags{receiver: "batch", streams: 2}
	}
	if r := j.receive.receiver; r != "client" && r != "batch" {
		return c, fmt.Errorf("unknown --receiver %q: want client or batch", r)
	}
	if j.receive.streams < 1 {
		return c, fmt.Errorf("--streams %d must be at least 1", j.receive.streams)
	}
	if j.receive.batchWait < 0 || j.receive.batchWait > time.Second {
		return c, fmt.Errorf("--batch-wait %v: want 0 (hand over at once what has arrived) to 1s", j.receive.batchWait)
	}
	c.receive = j.receive
	c.pipeline.Horizon, c.pipeline.AllowedLateness = j.time.horizon, j.time.lateness
	if j.time.horizon < dedup.MinHorizon {
		return c, fmt.Errorf("--horizon %v is below the minimum of %v", j.time.horizon, dedup.MinHorizon)
	}
	var err error
	if c.pipeline.HorizonMode, err = dedup.ParseHorizonMode(j.time.mode); err != nil {
		return c, fmt.Errorf("--horizon-mode: %w", err)
	}
	if c.state, err = parseState(j.state, j.time.horizon); err != nil {
		return c, err
	}
	if err := j.eventConfig(&c); err != nil {
		return c, err
	}
	c.pipeline.TimestampAttribute = j.time.tsAttr
	c.pipeline.Shadow = j.shadow
	return c, nil
}

// resolveNames resolves and checks the resource flags and the sink's.
func (j *jobFlags) resolveNames(c *jobConfig) error {
	n := j.names
	var err error
	if j.push.addr != "" || j.given["push-path"] || j.given["push-audience"] || j.given["push-service-account"] || j.given["push-jwks"] {
		if err := j.checkPush(c); err != nil {
			return err
		}
	}
	switch {
	case c.push.addr != "":
	case n.inSub != "" && n.inTopic != "":
		return errors.New("give --input-subscription or --input-topic, not both")
	case n.inSub != "":
		c.in, err = pubsubio.SubscriptionName(n.project, n.inSub)
	case n.inTopic != "":
		c.in, err = pubsubio.TopicName(n.project, n.inTopic)
		c.fromTopic = true
	default:
		return errors.New("missing input: give --input-subscription or --input-topic")
	}
	if err != nil {
		return err
	}
	c.project = clientProject(n.project, c.in)
	if c.sink, err = j.checkSink(); err != nil {
		return err
	}
	if n.outTopic != "" {
		if c.out, err = pubsubio.TopicName(n.project, n.outTopic); err != nil {
			return err
		}
		if c.project == "" {
			c.project = c.out.Project
		}
	}
	if n.deadLetter != "" {
		c.deadLetter, err = pubsubio.TopicName(n.project, n.deadLetter)
	}
	return err
}

// checkPush checks --input-push and --push-path.
func (j *jobFlags) checkPush(c *jobConfig) error {
	p, n := j.push, j.names
	switch {
	case p.addr == "":
		return errors.New("--push-path needs --input-push")
	case n.inSub != "" || n.inTopic != "":
		return errors.New("--input-push receives pushes and --input-subscription/--input-topic pull: give one of them")
	case !strings.HasPrefix(p.path, "/"):
		return fmt.Errorf("--push-path %q must start with /", p.path)
	case (p.audience == "") != (p.serviceAccount == ""):
		return errors.New("--push-audience and --push-service-account go together: a token is good only for this endpoint and from this service account")
	case j.given["push-jwks"] && p.audience == "":
		return errors.New("--push-jwks needs --push-audience and --push-service-account")
	}
	if u, err := url.Parse(p.jwks); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return fmt.Errorf("--push-jwks %q: want an http or https URL", redact.URL(p.jwks))
	}
	if _, _, err := net.SplitHostPort(p.addr); err != nil {
		return fmt.Errorf("--input-push %q: want host:port, e.g. 127.0.0.1:8090 (or :8080 in a container): %w", p.addr, err)
	}
	c.push = p
	return nil
}

// keyConfig checks where the key comes from and what a missing one does.
func (j *jobFlags) keyConfig(c *jobConfig) error {
	k := j.key
	missing, err := dedup.ParseMissing(k.missing)
	if err != nil {
		return fmt.Errorf("--missing-id: %w", err)
	}
	if err := j.checkAttributes(); err != nil {
		return err
	}
	from, path, err := dedup.ParseKeyFrom(k.keyFrom)
	if err != nil {
		return fmt.Errorf("--key-from: %w", err)
	}
	switch {
	case from != dedup.KeyFromAttribute && k.idAttr != "":
		return fmt.Errorf("--id-attribute is not read with --key-from %s; name the outputs' key attribute with --output-id-attribute", k.keyFrom)
	case missing != dedup.Fallback && k.idAttr == "" && from == dedup.KeyFromAttribute:
		return fmt.Errorf("--missing-id %s needs --id-attribute", k.missing)
	case missing == dedup.Reject && j.names.deadLetter == "":
		return errors.New("--missing-id reject needs --dead-letter-topic to send rejected messages to")
	}
	c.pipeline.IDAttribute, c.pipeline.Missing, c.pipeline.From, c.pipeline.Path = k.idAttr, missing, from, path
	c.pipeline.ProducerAttribute, c.pipeline.OutputIDAttribute = k.producerAttr, k.outIDAttr
	return nil
}

// eventConfig checks the event-time and audit flags.
func (j *jobFlags) eventConfig(c *jobConfig) error {
	t, a := j.time, j.audit
	var err error
	if c.pipeline.TimeDomain, err = dedup.ParseTimeDomain(t.domain); err != nil {
		return fmt.Errorf("--time-domain: %w", err)
	}
	if t.lateness < 0 {
		return fmt.Errorf("--allowed-lateness %v must not be negative", t.lateness)
	}
	if c.pipeline.Late, err = dedup.ParseLate(t.late); err != nil {
		return fmt.Errorf("--late: %w", err)
	}
	if c.pipeline.Late == dedup.LateDeadLetter && (c.pipeline.TimeDomain != dedup.EventTime || j.names.deadLetter == "") {
		return errors.New("--late dead-letter needs --time-domain event and --dead-letter-topic")
	}
	if a.horizon == 0 {
		return nil
	}
	if err := a.check(); err != nil {
		return err
	}
	if a.horizon <= t.horizon {
		return fmt.Errorf("--audit-horizon %v must be longer than --horizon %v", a.horizon, t.horizon)
	}
	c.pipeline.Audit = audit.Options{Horizon: a.horizon, FalsePositive: a.fp, Capacity: a.capacity}
	if err := c.pipeline.Audit.Validate(); err != nil {
		return fmt.Errorf("--audit-horizon/--audit-fp/--audit-capacity: %w", err)
	}
	// Beside the disk store's folder, so the audit survives restarts with
	// it (in Redis, the audit lives beside the keys instead).
	if c.state.path != "" {
		c.pipeline.AuditFile = c.state.path + ".audit"
	}
	return nil
}

// outputLabel says where survivors go, for the start log line: the topic,
// stdout or the table.
func (c *jobConfig) outputLabel() string {
	switch {
	case c.sink.kind == sinkPubSub:
		return c.out.String()
	case c.sink.kind == sinkPostgres || tableSink(c.sink.kind):
		return "table " + c.sink.table
	}
	return "stdout"
}
