package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
)

const benchProject = "bench-project"

// runEnv is what a consumer under test is told: where the broker is and
// which subscription to read and topic to write.
type runEnv struct {
	brokerAddr string
	inSub      pubsubio.Name
	outTopic   pubsubio.Name
	dir        string // scratch space of this run
	horizon    time.Duration
	replica    int // which of the run's replicas this process is, from 0
}

// consumer is one dedup contender run as a child process against the
// broker, so ours and Bento are treated alike: a black box that reads a
// subscription and writes a topic.
type consumer struct {
	name  string
	start func(ctx context.Context, env runEnv) (*child, error)
	// stats, if set, reads the consumer's own counters after it stopped.
	stats func(c *child) counters
	// leaky consumers are not crash-safe by design (the relay floor): the
	// duplicates they let through are counted, not failed.
	leaky bool
}

// counters are a consumer's own counts, from its last log line.
type counters map[string]any

func (c counters) String() string {
	if c == nil {
		return ""
	}
	if _, ok := c["dropped"]; ok {
		return fmt.Sprintf("received %v, emitted %v, dropped %v", c["received"], c["emitted"], c["dropped"])
	}
	return fmt.Sprintf("received %v, emitted %v, redeliveries %v, republishes %v",
		c["received"], c["emitted"], c["redeliveries"], c["republishes"])
}

// received is the messages the consumer says it took in, or 0.
func (c counters) received() float64 {
	v, _ := c["received"].(float64)
	return v
}

// pipeSample is one measured run.
type pipeSample struct {
	messagesIn int // published messages + injected redeliveries
	injected   int
	elapsed    time.Duration
	rate       float64 // messagesIn per second
	emitted    int
	leaked     int // keys emitted more than once (failed unless the consumer is leaky)
	stats      string
	cpuPerMsg  time.Duration // the consumer processes' CPU time (user+system) per message in; 0 when unknown
	procs      []procSample  // one per replica
}

// procSample is one consumer process of a run.
type procSample struct {
	cpu   time.Duration // user+system
	stats counters
}

// correctnessError is a leaked duplicate or a lost message: the benchmark
// fails on it, whatever the speed.
type correctnessError struct{ msg string }

func (e *correctnessError) Error() string { return e.msg }

// collector counts the outputs per key.
type collector struct {
	mu      sync.Mutex
	seen    map[string]int
	unknown int
	last    time.Time
}

func (c *collector) add(m *pubsub.Message) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := m.Attributes[attrKey]
	if !ok {
		c.unknown++
	} else {
		c.seen[k]++
	}
	c.last = time.Now()
}

func (c *collector) unique() (int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.seen), c.last
}

// benchRun is one run's fresh broker, with the input topic and its
// subscription, the output topic and a subscription to it.
type benchRun struct {
	rig    *rig
	client *pubsub.Client
	env    runEnv
	in     pubsubio.Name // the input topic
	outSub pubsubio.Name // reads the output topic
}

func openRun(ctx context.Context, dir string) (*benchRun, error) {
	r, err := startRig()
	if err != nil {
		return nil, err
	}
	cl, err := pubsubio.NewClient(ctx, benchProject, pubsubio.Insecure(r.addr)...)
	if err != nil {
		r.close()
		return nil, err
	}
	run := &benchRun{rig: r, client: cl}
	name := func(kind, id string) pubsubio.Name { return pubsubio.Name{Project: benchProject, Kind: kind, ID: id} }
	run.env = runEnv{brokerAddr: r.addr, inSub: name("subscriptions", "input-sub"), outTopic: name("topics", "output"),
		dir: dir, horizon: 10 * time.Minute}
	run.in, run.outSub = name("topics", "input"), name("subscriptions", "output-sub")
	err = func() error {
		for _, t := range []pubsubio.Name{run.in, run.env.outTopic} {
			if err := pubsubio.EnsureTopic(ctx, cl, t); err != nil {
				return err
			}
		}
		if err := pubsubio.EnsureSubscription(ctx, cl, run.env.inSub, run.in, 60); err != nil {
			return err
		}
		return pubsubio.EnsureSubscription(ctx, cl, run.outSub, run.env.outTopic, 60)
	}()
	if err != nil {
		run.close()
		return nil, err
	}
	return run, nil
}

func (b *benchRun) close() {
	b.client.Close()
	b.rig.close()
}

// measurePipeline runs one consumer over one workload on a fresh broker:
// the workload is published first, then the consumer is started and timed
// from the first delivery to the moment every input message is acked and
// every event is in the output. A quiet period afterwards catches late
// duplicates; then every key must have come out exactly once.
//
// replicas processes of the consumer share the input subscription. watch,
// if set, is called with each process once started (a profiler); what it
// returns is called before the processes are stopped.
func measurePipeline(ctx context.Context, c consumer, replicas int, wl workload, dir string, timeout, quiet time.Duration,
	watch func(*child) (func(), error)) (pipeSample, error) {
	run, err := openRun(ctx, dir)
	if err != nil {
		return pipeSample{}, err
	}
	defer run.close()
	r, cl, env, in, outSub := run.rig, run.client, run.env, run.in, run.outSub
	msgs := wl.plan()
	total, _, _ := counts(msgs)
	usable := total - wl.unusableIn(msgs) // the rest are never acked: nothing can judge them
	if err := wl.publish(ctx, cl, in.String(), msgs); err != nil {
		return pipeSample{}, err
	}
	msgs = nil
	r.inj.watch(env.inSub.String())

	col := &collector{seen: make(map[string]int, wl.events)}
	rctx, stopRecv := context.WithCancel(ctx)
	defer stopRecv()
	recvDone := make(chan error, 1)
	sub := cl.Subscriber(outSub.String())
	sub.ReceiveSettings.NumGoroutines = 2
	sub.ReceiveSettings.MaxOutstandingMessages = 10_000
	go func() {
		recvDone <- sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) { col.add(m); m.Ack() })
	}()
	stopCollector := func() error {
		stopRecv()
		if err := <-recvDone; err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("receive outputs: %w", err)
		}
		return nil
	}

	var chs []*child
	var unwatch []func()
	defer func() {
		for _, u := range unwatch {
			u()
		}
		for _, ch := range chs {
			ch.kill()
		}
	}()
	for i := range replicas {
		env.replica = i
		ch, err := c.start(ctx, env)
		if err != nil {
			return pipeSample{}, errors.Join(err, stopCollector())
		}
		chs = append(chs, ch)
		if watch != nil {
			u, err := watch(ch)
			if err != nil {
				return pipeSample{}, errors.Join(err, stopCollector())
			}
			unwatch = append(unwatch, u)
		}
	}

	deadline := time.Now().Add(timeout)
	var first, end time.Time
	for {
		acked, f, lastAck := r.inj.progress()
		uniq, lastOut := col.unique()
		if acked >= usable && uniq >= wl.good() {
			first, end = f, lastAck
			if lastOut.After(end) {
				end = lastOut
			}
			break
		}
		for _, ch := range chs {
			if done, werr := ch.exited(); done {
				return pipeSample{}, errors.Join(fmt.Errorf("%s exited while running: %v (log: %s)", ch.name, werr, ch.tail()), stopCollector())
			}
		}
		if time.Now().After(deadline) {
			return pipeSample{}, errors.Join(&correctnessError{fmt.Sprintf(
				"%s: after %v, %d of %d input messages acked and %d of %d events in the output (lost or stuck)",
				c.name, timeout, acked, usable, uniq, wl.good())}, stopCollector())
		}
		select {
		case <-ctx.Done():
			return pipeSample{}, errors.Join(ctx.Err(), stopCollector())
		case <-time.After(20 * time.Millisecond):
		}
	}
	// Late copies of keys already emitted would arrive now.
	select {
	case <-ctx.Done():
		return pipeSample{}, errors.Join(ctx.Err(), stopCollector())
	case <-time.After(quiet):
	}
	for _, u := range unwatch {
		u()
	}
	unwatch = nil
	errs := make([]error, len(chs))
	var wg sync.WaitGroup
	for i, ch := range chs {
		wg.Go(func() { errs[i] = ch.stop(20 * time.Second) }) // all at once: replicas drain together
	}
	wg.Wait()
	stopErr := errors.Join(errs...)
	time.Sleep(200 * time.Millisecond) // outputs flushed on shutdown
	if err := errors.Join(stopErr, stopCollector()); err != nil {
		return pipeSample{}, err
	}

	s := pipeSample{injected: int(r.inj.injected.Load()), elapsed: end.Sub(first)}
	s.messagesIn = total + s.injected
	s.rate = float64(s.messagesIn) / s.elapsed.Seconds()
	// CPU per message does not depend on what else the machine runs, so
	// it compares consumers even when the rates are noisy. It includes
	// start-up and the quiet period, which favours neither side.
	var cpu time.Duration
	for _, ch := range chs {
		var p procSample
		if ps := ch.cmd.ProcessState; ps != nil {
			p.cpu = ps.UserTime() + ps.SystemTime()
		}
		cpu += p.cpu
		if c.stats != nil {
			p.stats = c.stats(ch)
		}
		s.procs = append(s.procs, p)
	}
	s.cpuPerMsg = cpu / time.Duration(s.messagesIn)
	if len(s.procs) == 1 {
		s.stats = s.procs[0].stats.String()
	}
	for _, n := range col.seen {
		s.emitted += n
	}
	leaked, err := verifyOutputs(wl, col.seen, col.unknown, c.leaky)
	s.leaked = leaked
	if err != nil {
		return s, fmt.Errorf("%s: %w", c.name, err)
	}
	return s, nil
}

// verifyOutputs checks that every usable event's key came out exactly once
// and nothing else came out. With leaky, keys that came out more than once
// are only counted.
func verifyOutputs(wl workload, seen map[string]int, unknown int, leaky bool) (leakedKeys int, err error) {
	var leaked, lost, judged []string
	for e := 0; e < wl.events; e++ {
		switch n := seen[wl.key(e)]; {
		case wl.unusable(e):
			if n > 0 {
				judged = append(judged, wl.key(e))
			}
		case n == 0:
			lost = append(lost, wl.key(e))
		case n > 1:
			leaked = append(leaked, fmt.Sprintf("%s×%d", wl.key(e), n))
		}
	}
	if leaky && len(lost) == 0 && len(judged) == 0 && unknown == 0 && len(seen) == wl.good() {
		return len(leaked), nil
	}
	if len(leaked) > 0 || len(lost) > 0 || len(judged) > 0 || unknown > 0 || len(seen) != wl.good() {
		return len(leaked), &correctnessError{fmt.Sprintf("%d duplicates leaked %v, %d events lost %v, %d unusable events emitted %v, %d outputs without a key, %d distinct keys for %d usable events",
			len(leaked), firstFew(leaked), len(lost), firstFew(lost), len(judged), firstFew(judged), unknown, len(seen), wl.good())}
	}
	return 0, nil
}

func firstFew(s []string) []string {
	if len(s) > 5 {
		return append(s[:5:5], "…")
	}
	return s
}

// dedupflowConsumer runs `dedupflow pipeline` with the given --state and
// extra flags.
func dedupflowConsumer(bin, label string, state func(env runEnv) string, extra ...string) consumer {
	return consumer{
		name: "dedupflow pipeline (" + label + ")",
		start: func(ctx context.Context, env runEnv) (*child, error) {
			name := fmt.Sprintf("dedupflow-%s-%d", strings.ReplaceAll(label, " ", "-"), env.replica)
			args := append([]string{"pipeline",
				"--project", benchProject, "--input-subscription", env.inSub.ID, "--output-topic", env.outTopic.ID,
				"--id-attribute", attrKey, "--horizon", env.horizon.String(), "--state", state(env),
				"--metrics-addr", "", "--log-format", "json", "--log-level", "info"}, extra...)
			return startChild(name, filepath.Join(env.dir, name+".log"), env.dir,
				[]string{"PUBSUB_EMULATOR_HOST=" + env.brokerAddr}, bin, args...)
		},
		stats: dedupflowStats,
	}
}

// dedupflowStats reads the pipeline's own counters from its last log line,
// to show that it told the two kinds of duplicates apart.
func dedupflowStats(c *child) counters { return lastLogLine(c, "pipeline stopped") }

// lastLogLine is the last JSON line of c's log whose msg is msg, or nil.
func lastLogLine(c *child, msg string) counters {
	f, err := os.Open(c.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var last map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil && m["msg"] == msg {
			last = m
		}
	}
	return last
}

// relayFloorConsumer runs bench/relayfloor: the least work a dedup relay on
// the official client can do, the floor the pipeline's CPU is held to.
// receiver and publish are its --receiver and --publish modes.
func relayFloorConsumer(bin, name, receiver, publish string) consumer {
	return consumer{
		name: name,
		start: func(ctx context.Context, env runEnv) (*child, error) {
			log := fmt.Sprintf("relayfloor-%s-%s-%d.log", receiver, publish, env.replica)
			return startChild("relayfloor", filepath.Join(env.dir, log), env.dir,
				[]string{"PUBSUB_EMULATOR_HOST=" + env.brokerAddr}, bin, "--receiver", receiver, "--publish", publish,
				"--project", benchProject, "--subscription", env.inSub.ID, "--topic", env.outTopic.ID, "--key", attrKey)
		},
		stats: func(c *child) counters { return lastLogLine(c, "relay stopped") },
		leaky: true,
	}
}

// bentoConsumer runs Bento: gcp_pubsub input -> dedupe (memory cache,
// the same TTL as our horizon) -> gcp_pubsub output, all defaults
// otherwise (1000 outstanding messages, as our pipeline). With batch > 0
// the input is wrapped in Bento's batched input (batches of up to batch
// messages, flushed every 20 ms), the tuning that made its dedupe fastest
// when measured alone.
func bentoConsumer(bin, name string, batch int) consumer {
	return consumer{
		name: name,
		start: func(ctx context.Context, env runEnv) (*child, error) {
			in := fmt.Sprintf(`  gcp_pubsub:
    project: %q
    subscription: %q`, benchProject, env.inSub.ID)
			if batch > 0 {
				in = fmt.Sprintf(`  batched:
    policy:
      count: %d
      period: 20ms
    child:
      gcp_pubsub:
        project: %q
        subscription: %q`, batch, benchProject, env.inSub.ID)
			}
			cfg := fmt.Sprintf(`http:
  enabled: false
logger:
  level: WARN
metrics:
  none: {}
input:
%s
pipeline:
  processors:
    - dedupe:
        cache: keys
        key: '${! @%s }'
output:
  gcp_pubsub:
    project: %q
    topic: %q
cache_resources:
  - label: keys
    memory:
      default_ttl: %s
`, in, attrKey, benchProject, env.outTopic.ID, env.horizon)
			path := filepath.Join(env.dir, "bento.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
				return nil, fmt.Errorf("write bento config: %w", err)
			}
			return startChild("bento", filepath.Join(env.dir, "bento.log"), env.dir,
				[]string{"PUBSUB_EMULATOR_HOST=" + env.brokerAddr}, bin, "-c", path)
		},
	}
}

// label names a dup ratio the way the report does.
func ratioLabel(r float64) string { return fmt.Sprintf("%.0f%% copies", r*100) }

// buildContenders builds the pipeline and the relay floor.
func (e *env) buildContenders(ctx context.Context) (pipelineBin, floorBin string, err error) {
	if pipelineBin, err = e.buildPipeline(ctx); err != nil {
		return "", "", err
	}
	floorBin, err = e.build(ctx, "relayfloor", dedupflowModule+"/bench/relayfloor")
	return pipelineBin, floorBin, err
}

// The pipeline's --state for the memory and the disk store.
func memState(runEnv) string      { return "mem" }
func diskState(env runEnv) string { return "file:" + filepath.Join(env.dir, "state.db") }

// named is c under another name in the report.
func named(c consumer, name string) consumer { c.name = name; return c }

// client runs the pipeline on the official client's Receive.
var client = []string{"--receiver", "client"}
