package main

import (
	_ "embed"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// row is one line of a report table: one contender in one group (a
// workload variant), with one value per run.
type row struct {
	section string
	group   string // e.g. "30% copies", "publish", "10M live keys"
	name    string
	ours    bool
	peer    string // name of the row in the same group the ratio is taken against
	count   string
	unit    string
	values  []float64
	fixed   string // a documented figure shown instead of measurements
	note    string
	from    int // 0: this run; i: earlier run i (env.earlier[i-1]), kept by a partial run
}

func (r row) median() float64 {
	if len(r.values) == 0 {
		return math.NaN()
	}
	v := append([]float64(nil), r.values...)
	sort.Float64s(v)
	if n := len(v); n%2 == 1 {
		return v[n/2]
	} else {
		return (v[n/2-1] + v[n/2]) / 2
	}
}

func (e *env) add(r row) {
	e.rows = append(e.rows, r)
	e.logf("%-9s %-14s %-44s median %s %s over %d run(s) %v", r.section, r.group, r.name, num(r.median()), r.unit, len(r.values), r.values)
}

// find returns the row named name in section/group.
func (e *env) find(section, group, name string) (row, bool) {
	for _, r := range e.rows {
		if r.section == section && r.group == group && r.name == name {
			return r, true
		}
	}
	return row{}, false
}

// ratio is this row's median over its peer's, or "" without a peer.
func (e *env) ratio(r row) string {
	if r.peer == "" || len(r.values) == 0 {
		return ""
	}
	p, ok := e.find(r.section, r.group, r.peer)
	if !ok || len(p.values) == 0 || p.median() == 0 {
		return "— (" + r.peer + " not measured)"
	}
	if p.from != r.from {
		return "— (" + r.peer + " measured in another run)"
	}
	x := r.median() / p.median()
	if x < 0.1 {
		return fmt.Sprintf("%.3f× %s", x, r.peer) // pstest's receive rate would round to 0.00×
	}
	return fmt.Sprintf("%.2f× %s", x, r.peer)
}

// num formats a value: thousands separated above 1000, one decimal below.
func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "—"
	case math.Abs(v) >= 1000:
		s := strconv.FormatInt(int64(math.Round(v)), 10)
		var b strings.Builder
		for i, c := range s {
			if i > 0 && (len(s)-i)%3 == 0 && s[i-1] != '-' {
				b.WriteByte(',')
			}
			b.WriteRune(c)
		}
		return b.String()
	case v != 0 && math.Abs(v) < 1:
		return strconv.FormatFloat(v, 'f', 3, 64) // per-message counts such as 0.034 reads
	case math.Abs(v) < 10:
		return strconv.FormatFloat(v, 'f', 2, 64) // 1.76 commands per message
	default:
		return strconv.FormatFloat(v, 'f', 1, 64)
	}
}

// inum formats a count: an integer, thousands separated.
func inum(n int) string {
	if n < 1000 && n > -1000 {
		return strconv.Itoa(n)
	}
	return num(float64(n))
}

type sectionText struct{ key, title, method string }

var sectionsText = []sectionText{
	{"broker", "1. Broker: dedupflow broker vs Google's emulator vs pstest",
		"`BenchmarkEndToEnd` of `broker/bench_test.go`, run by the bench with `go test`: the official Go client " +
			"(`cloud.google.com/go/pubsub/v2`) publishes 100-byte messages with two attributes (batches of up to 1000, 16 " +
			"goroutines), then receives them with streaming pull and acks them. pstest gets fewer messages: its streaming " +
			"pull hands out about one message per stream per 10 ms tick. Ratios: this row ÷ the named row. " +
			"The restart rows are `BenchmarkRestart` of `broker/restart_bench_test.go`: a broker process on a data " +
			"directory with 1,000,000 messages queued on one subscription is killed with SIGKILL and started again, then " +
			"stopped with SIGTERM and started again; each time the seconds from starting the process until a new " +
			"subscriber (official Go client, streaming pull) receives its first message."},
	{"pipeline", "2–4. Dedup pipelines: dedupflow vs Bento vs NATS JetStream",
		"Each run starts a fresh in-memory dedupflow broker in the bench process and publishes the whole workload to the " +
			"input topic first: N logical events with a key attribute and a ~100-byte payload; a share of them (the group) is " +
			"published a second time as a new message with the same key, a little later in the stream (up to 2,000 messages " +
			"later), as a retrying publisher does; 2% of events lose their first ack (a gRPC interceptor in the bench's broker " +
			"turns that ack into a nack, so the same message ID comes back — a redelivery, injected identically for every " +
			"consumer). Then the consumer is started as a child process (`dedupflow pipeline` built from this tree, or Bento " +
			"with `gcp_pubsub` → `dedupe` on a memory cache with the same 10-minute TTL → `gcp_pubsub`, once with its defaults " +
			"and once with the input batched), and timed from the " +
			"first delivery until every input message is acked and every event is in the output topic. *Messages in* counts " +
			"published messages plus injected redeliveries. After a quiet period the consumer is stopped and every key must " +
			"be in the output exactly once, or the run fails. NATS JetStream is measured differently, because its dedup is on " +
			"the publish side: an embedded server (in process, memory storage, duplicate window 10 minutes), the same events " +
			"and copies published asynchronously with `Nats-Msg-Id` = key (redeliveries do not apply), and the stream must " +
			"hold exactly one message per event. Ratios: this row ÷ the named row."},
	{"cpu", "5. CPU per message: dedupflow vs the relay floor",
		"The same runs as sections 2–4, measured in CPU instead of time: each consumer process's user + system CPU " +
			"(from its exit status; start-up and the quiet period included, which favours neither side) ÷ messages in. " +
			"The **relay floor** is `bench/relayfloor`, built and run like the pipeline: the least work a dedup relay on " +
			"the official Go client can do — `Receive`, an in-memory seen-map, `Publish` (batches of up to 1000, as the " +
			"pipeline's topic sink), `Ack` once the publish is confirmed. It has no claim/commit and is not crash-safe " +
			"(a key is marked seen before its output is written), so the copies it lets through are counted, not failed; " +
			"a lost message still fails the run. The Redis store's row counts the pipeline process only; the redis-server " +
			"row beside it is the bench's own server's CPU (`/proc/PID/stat`) over the same runs. Ratios: this row ÷ the floor. " +
			"The **batch relay floor** is the same relay on the pipeline's own receiver (`relayfloor --receiver batch`): " +
			"`pubsubio/pull` (StreamingPull on the low-level API) hands it a batch at a time, the batch's first copies go " +
			"out in one Publish RPC, and the batch is acked once that is confirmed; the default (batch) path's rows name " +
			"their ratio to it in their notes. That ratio and the Targets table's are the median of the runs' own ratios: " +
			"a run measures every contender in turn, so its two figures share the machine's state of the moment. " +
			"Where a target is missed, `bench/notes.md` says where the profile puts the difference."},
	{"latency", "5b. Latency from publish to output: the batch path vs the client path vs the relay floor",
		"Each run starts a fresh in-memory dedupflow broker in the bench process and the consumer as a child process, as " +
			"in sections 2–4, waits until a first message has come through, then publishes messages of distinct keys at a " +
			"steady rate (the official Go client's Publisher, batches flushed every 1 ms), each stamped with the moment it " +
			"was handed to the publisher. A subscriber on the output topic takes each key's first output and its latency " +
			"is its arrival minus that stamp; the rows are percentiles over every message of a run (nearest rank), the " +
			"median over runs; the CPU rows are the consumer process's CPU over the paced part ÷ its messages. The rates " +
			"are well below every contender's capacity, where a batching reader could only lose. By default the batch " +
			"path hands over what has arrived as soon as a stream is idle; the `--batch-wait 5ms` row makes an idle stream " +
			"wait up to 5 ms for more. Ratios: this row ÷ the relay floor's."},
	{"unusable", "5c. Unusable messages without a dead-letter topic: the good ones are not held up",
		"Run with the pipeline section. Through the binary: a fresh broker as in sections 2–4, 1,000 events (a batch's worth) " +
			"published first (no copies, no redeliveries), each with an event time in a `ts` attribute, and `dedupflow pipeline " +
			"--timestamp-attribute ts` with the memory store and no dead-letter topic; in one of the two workloads every " +
			"10th event's `ts` is not a time. Such a message cannot be judged and has nowhere to go, so it is nacked with a " +
			"delay and never emitted; the run is timed from the first delivery until every good event is in the output and " +
			"acked, and the output must hold each good event exactly once and none of the others. The two workloads run " +
			"one after the other in each run. In process: `BenchmarkPassBatchUnusable` of `internal/gate`, run by the bench " +
			"with `go test`: one `PassBatch` of 1,000 messages, clean or with 40 whose event time is malformed. " +
			"Ratios: this row ÷ the named row."},
	{"replicas", "6. Replicas on a Redis Cluster",
		"1, 2 and 4 `dedupflow pipeline` processes on one subscription of the bench's broker, sharing their horizon in a " +
			"Redis Cluster of three masters that the bench starts (`redis-server --cluster-enabled yes`, joined by " +
			"`redis-cli --cluster create … --cluster-replicas 0`; `--state 'redis://…/0?cluster=true&addr=…'`), on the 30% " +
			"workload with the same correctness check as sections 2–4. Per replica: the messages it received ÷ the run's " +
			"time, and its CPU ÷ those messages. Per Redis node: its CPU (`/proc/PID/stat`) ÷ messages in. Commands are " +
			"`INFO` `total_commands_processed` deltas summed over the nodes (the breakdown from `INFO commandstats`); " +
			"*reads* are `total_reads_processed` deltas, the read events the servers handled: every client pipeline, " +
			"split by node, arrives in at least one, so it bounds round trips from above (the pipeline does not export " +
			"its batch count). **On a 2-core machine these numbers show cost, not speedup:** the replicas, the three " +
			"nodes, the broker and the bench share two cores, so more replicas cannot go faster; what carries over to a " +
			"real deployment is the cost per message, which [docs/scaling.md](docs/scaling.md) projects to 100k, 1M and 10M " +
			"messages a second."},
	{"memory", "7. Memory per live key",
		"`BenchmarkClaimCommit` of `store/mem/bench_test.go`, run by the bench: a steady state with exactly N keys inside " +
			"the horizon (every insert matched by an expiry), heap measured after GC; the bare map does the same with " +
			"`map[[16]byte]struct{}`. Redis: keys claimed and committed through `store/redis` (and, for the hand-rolled " +
			"peer, `SET key value NX PX`), `used_memory` growth ÷ keys. NATS: the figure its documentation gives for a " +
			"dedup-window entry, not measured here."},
	{"redis", "8. Redis store vs a hand-rolled go-redis SET NX PX",
		"`BenchmarkClaim` of `store/redis/bench_test.go`, run by the bench against its own redis-server: a claim of a new " +
			"key through the store from 1000 goroutines, vs `SET NX PX` in go-redis pipelines of 500 (four in flight) and " +
			"one by one from 1000 goroutines. Ratios: this row ÷ the named row."},
	{"soak", "9. Soak: restarts on a schedule, as deployed",
		"Run on demand with `go run ./bench --only soak` (a short version runs with `--quick` in CI). `dedupflow broker " +
			"--data-dir` runs as its own process for the whole soak, with `--metrics-addr`; `dedupflow pipeline` reads its " +
			"subscription with the disk store (`--state file:…`, horizon 1h) and writes to a PostgreSQL table (the keyed " +
			"upsert sink). The bench publishes the keys with a ~100-byte payload, 30% of them a second time as a new message " +
			"(a republish), evenly over the publishing time, and every 5 s takes a snapshot of the subscription and seeks it " +
			"back to that snapshot 2% of 5 s later, so what was acknowledged in between is delivered again with its message " +
			"ID (a redelivery). The pipeline is stopped with SIGTERM every 30 s and killed with SIGKILL every 45 s (SIGKILL " +
			"when both are due) and started again each time. Every second the bench reads both processes' " +
			"`process_resident_memory_bytes` and `go_goroutines` from their `/metrics`. After each end of a pipeline run, " +
			"the broker must hold none of the subscription's streams open (`dedupflow_broker_open_streaming_pulls`) and its " +
			"goroutines must come back to their level before any pipeline connected (the bench reads each process's page " +
			"over one connection, so its own reads count the same at every check). At the end the " +
			"table must hold exactly the published keys, none missing and none else, and the subscription must be drained; " +
			"each process's peak resident memory must stay under its bound. The counts are the pipeline's own counters, " +
			"summed over its runs (a killed run's last second of counts is lost). One soak per bench run: `--runs` does not " +
			"repeat it, so each figure is of that one soak. The publisher keeps publishing while a pipeline is down, and " +
			"the broker's goroutines are at their level only at a moment when no publish is in flight; a leak would keep " +
			"them above it for good."},
}

// writeOutputs writes the report and the plots, where asked.
func (e *env) writeOutputs() error {
	if e.cfg.plots != "" {
		if err := e.writePlots(e.cfg.plots); err != nil {
			return err
		}
	}
	if e.cfg.out == "" {
		e.printSummary()
		return nil
	}
	if err := os.WriteFile(e.cfg.out, []byte(e.markdown()), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	e.logf("wrote %s", e.cfg.out)
	return nil
}

// printSummary is the quick mode's output: the medians, on stdout.
func (e *env) printSummary() {
	for _, r := range e.rows {
		med := num(r.median()) + " " + r.unit
		if r.fixed != "" {
			med = r.fixed
		}
		fmt.Fprintf(e.stdout, "%-9s %-20s %-52s %18s  %s\n", r.section, r.group, r.name, med, e.ratio(r))
	}
	for _, a := range e.absent {
		fmt.Fprintf(e.stdout, "absent: %s\n", a)
	}
}

func (e *env) markdown() string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	args := e.savedArgs
	if args == nil {
		args = benchArgs(e.cfg)
	}
	w("# Benchmarks\n\n")
	w("Produced by `go run ./bench %s` on %s. Every number is the median of %d runs unless a row says otherwise; "+
		"every contender ran in the same invocation, interleaved run by run.\n\n",
		strings.Join(args, " "), e.date, e.cfg.runs)
	w("%s", e.earlierText())
	w("**Machine:** %s.  \n", e.machine)
	w("**Load:** before the run `%s`; after it `%s`. ", e.loadBefore, e.loadAfter)
	w("The machine is shared with other engineers' test runs, so absolute numbers are noisy; the ratios between " +
		"contenders measured side by side in the same run are the more stable result.\n\n")
	if e.bentoVersion != "" {
		w("**Bento:** `%s` (%s), built outside this repository from its public source with only the components "+
			"the benchmark uses (gcp, io, pure); none of its code is in this repository.\n\n", e.cfg.bento, e.bentoVersion)
	}
	if len(e.failures) > 0 {
		w("## FAILED\n\n")
		for _, f := range e.failures {
			w("- %s\n", f)
		}
		w("\n")
	}
	if len(e.absent) > 0 {
		w("## Not measured\n\n")
		for _, a := range e.absent {
			w("- %s\n", a)
		}
		w("\n")
	}
	w("## Targets\n\n%s\n", e.targets())
	w("%s\n", howTo)
	for _, s := range sectionsText {
		rows := e.sectionRows(s.key)
		if len(rows) == 0 {
			continue
		}
		w("## %s\n\n%s\n\n", s.title, s.method)
		w("| contender | workload | counts | median | runs | ratio | machine |\n|---|---|---|---:|---|---|---|\n")
		for _, r := range rows {
			med := num(r.median()) + " " + r.unit
			if r.fixed != "" {
				med = r.fixed
			}
			name := r.name
			if r.ours {
				name = "**" + name + "**"
			}
			runs := make([]string, len(r.values))
			for i, v := range r.values {
				runs[i] = num(v)
			}
			cnt := r.count
			if r.note != "" {
				cnt += "; " + r.note
			}
			w("| %s | %s | %s | %s | %s | %s | %s |\n", name, r.group, cnt, med, strings.Join(runs, " / "), e.ratio(r), e.machineOf(r))
		}
		if p := e.plotRef(s.key); p != "" {
			w("\n![%s](%s)\n", s.title, p)
		}
		w("\n")
	}
	w("## Component measurements\n\n%s", notes)
	return b.String()
}

// notes is the hand-kept file of component measurements, copied into the
// report as it is: numbers from benchmarks of one part (a store's engine, a
// data structure) that the bench does not run itself.
//
//go:embed notes.md
var notes string

func (e *env) sectionRows(section string) []row {
	var out []row
	for _, r := range e.rows {
		if r.section == section {
			out = append(out, r)
		}
	}
	return out
}

// plotRef is the link from the report to a section's plot, if written.
func (e *env) plotRef(section string) string {
	if e.cfg.plots == "" {
		return ""
	}
	p := filepath.Join(e.cfg.plots, section+".png")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	if rel, err := filepath.Rel(filepath.Dir(e.cfg.out), p); err == nil {
		p = rel
	}
	return filepath.ToSlash(p)
}

// benchArgs is the command line the report was made with, for the reader
// to repeat it.
func benchArgs(c config) []string {
	var a []string
	if c.quick {
		a = append(a, "--quick")
	}
	var only []string
	for _, s := range sectionNames {
		if c.only[s] {
			only = append(only, s)
		}
	}
	if len(only) > 0 {
		a = append(a, "--only", strings.Join(only, ","))
	}
	if len(c.ratios) > 0 && !c.quick {
		rs := make([]string, len(c.ratios))
		for i, r := range c.ratios {
			rs[i] = strconv.FormatFloat(r, 'g', -1, 64)
		}
		if j := strings.Join(rs, ","); j != "0,0.1,0.3,0.6" {
			a = append(a, "--ratios", j)
		}
	}
	a = append(a, "--runs", strconv.Itoa(c.runs), "--events", strconv.Itoa(c.events))
	if c.only["soak"] && !c.quick {
		for _, f := range []struct {
			name     string
			v, usual any
		}{{"--soak-keys", c.soakKeys, 1_000_000}, {"--soak-for", c.soakFor, 10 * time.Minute},
			{"--soak-term", c.soakTerm, 30 * time.Second}, {"--soak-kill", c.soakKill, 45 * time.Second}} {
			if f.v != f.usual {
				a = append(a, f.name, fmt.Sprint(f.v))
			}
		}
	}
	if c.bento != "" {
		a = append(a, "--bento", c.bento)
	}
	if c.out != "" {
		a = append(a, "--out", c.out)
	}
	return a
}

// targets checks the two goals the issue sets.
func (e *env) targets() string {
	var b strings.Builder
	b.WriteString("| target | measured | met |\n|---|---|---|\n")
	verdict := func(ok bool) string {
		if ok {
			return "yes"
		}
		return "**no**"
	}
	g := ratioLabel(0.3)
	mem, okM := e.find("pipeline", g, nameMem)
	for _, peer := range []string{nameBento, nameBentoBatched} {
		p, okP := e.find("pipeline", g, peer)
		if !okM || !okP || len(p.values) == 0 || len(mem.values) == 0 || p.from != mem.from {
			fmt.Fprintf(&b, "| pipeline, 30%% copies: ≥ 2× the peer's messages/s on the same broker (peer: %s) | not measured in one run | — |\n", peer)
			continue
		}
		x := mem.median() / p.median()
		fmt.Fprintf(&b, "| pipeline, 30%% copies: ≥ 2× the peer's messages/s on the same broker (peer: %s) | %s vs %s msg/s = %.2f× | %s |\n",
			peer, num(mem.median()), num(p.median()), x, verdict(x >= 2))
	}
	if r, ok := e.find("broker", groupRestart, nameRestartKill); ok && len(r.values) > 0 && strings.HasPrefix(r.count, "1,000,000 ") {
		fmt.Fprintf(&b, "| broker: restart to first delivery ≤ 3 s with a million messages queued (after SIGKILL) | %s s | %s |\n", num(r.median()), verdict(r.median() <= 3))
	} else {
		b.WriteString("| broker: restart to first delivery ≤ 3 s with a million messages queued (after SIGKILL) | not measured (quick mode queues 2,000) | — |\n")
	}
	b.WriteString(e.cpuTargetRows(verdict))
	if m, ok := e.find("memory", "10M live keys", nameMemStore); ok {
		fmt.Fprintf(&b, "| memory store: ≤ 32 B per live key at 10M keys | %.1f B | %s |\n", m.median(), verdict(m.median() <= 32))
	} else {
		b.WriteString("| memory store: ≤ 32 B per live key at 10M keys | not measured (quick mode measures 1M only) | — |\n")
	}
	return b.String()
}

const howTo = `## How to run

` + "```" + `
go run ./bench --quick                          # smoke test, ~1 min: every contender starts, outputs correct, no files written
go run ./bench --runs 3 --bento PATH/TO/bento   # full run, ~30 min on 2 cores: writes BENCHMARKS.md and docs/bench/*.png
go run ./bench --only pipeline --ratios 0.3     # one section, one ratio; rows of other sections are kept from docs/bench/results.json
go run ./bench --only pipeline,replicas --ratios 0.3 --runs 3   # the relay floor and CPU ratios (5), replicas on Redis Cluster (6)
go run ./bench --only pipeline --ratios 0.3 --runs 3 --events 300000   # the CPU ratios (5) with runs of ~2 s of CPU each, ~6 min
go run ./bench --only pipeline --ratios 0.3 --runs 2 --profile /tmp/prof   # perf profiles of the pipeline rows, /tmp/prof/summary.txt
go run ./bench --save r.json ...; go run ./bench --load r.json   # redraw the report and plots without measuring
` + "```" + `

The replica section also needs ` + "`redis-cli`" + ` (Debian ` + "`redis-tools`" + `, which ` + "`redis-server`" + ` pulls in) to join its
cluster, and ` + "`--profile`" + ` needs Linux ` + "`perf`" + ` (Debian ` + "`linux-perf`" + `).

The bench starts what it needs on loopback ports and stops it, also on Ctrl-C: Google's emulator
(Debian ` + "`google-cloud-cli-pubsub-emulator`" + `), ` + "`redis-server --save ''`" + `, the pipeline built from this tree,
and Bento when ` + "`--bento`" + ` names a binary. What is not installed is listed under *Not measured* instead of
failing the run; a leaked duplicate or a lost message in any run makes it exit non-zero. Bento's module is
not served by the Go module proxy here, so it has to be built outside this repository from its public source.

**Reading the results.** The pipeline rows are the comparison users face: the same broker, the same input,
the same output topic, and a correctness check on every run. Bento runs twice: as configured out of the box
(one message at a time through ` + "`dedupe`" + `) and tuned, with its input wrapped in ` + "`batched`" + ` (500 messages or 20 ms),
which lets ` + "`dedupe`" + ` and the output work on whole batches. dedupflow's default receiver batches too: it
takes a StreamingPull response at a time and makes one store call to claim its keys, one sink write, one commit
and one ack request per batch, while each message keeps its own key, outcome and ack or nack; a stream hands over
what has arrived as soon as it is idle, so batches grow with the load and wait for nothing. The rows marked
` + "`--receiver client`" + ` are the official client's ` + "`Receive`" + `, which handles each message on its own (claim, write,
commit, ack) over the client's and the stores' batching. Bento's ` + "`dedupe`" + `
records a key before the output is written (a failed write then loses the message; dedupflow records it only
after the write), so it also does less work per message than the claim/commit protocol. NATS's row is a different shape of system — dedup inside the
store at publish time, with no consumer, no output topic and no redeliveries — and is shown for scale, not as a
like-for-like peer. The dedupflow rows' notes give the pipeline's own counters, which tell redeliveries (same
message ID) from republishes (new message, same key); *received* exceeds *messages in* by the copies that were
nacked because their original was still being written (they come back and are then dropped as duplicates).
A run's end is the last input ack, which the Go clients send on a 100 ms tick, so each time is ±0.1 s.
`
