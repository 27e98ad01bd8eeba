// Command bench measures dedupflow against the tools users would pick
// instead, with one workload, in one run, on this machine:
//
//	go run ./bench --quick                  # seconds: every contender starts and is correct
//	go run ./bench --runs 3 --out BENCHMARKS.md --bento /work/ext/bento/bento
//
// Contenders: our broker against Google's emulator and pstest; the
// dedupflow pipeline (memory, disk and Redis stores) against Bento's
// dedupe and NATS JetStream's Nats-Msg-Id dedup; memory per live key of
// our memory store against a bare Go map; our Redis store against a
// hand-rolled SET NX PX pipeline. It starts what it needs (the emulator,
// redis-server, the pipeline binary, Bento when given) and stops all of it,
// also on SIGINT. A duplicate leaking through or a message lost in any run
// makes it exit non-zero. A contender that is not installed (the emulator,
// redis-server, Bento) is reported as absent, not failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const defaultEmulator = "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator"

// dedupflowModule is the module the bench builds and measures.
const dedupflowModule = "github.com/dedupflow/dedupflow"

// config is what the flags say.
type config struct {
	quick     bool
	out       string
	plots     string
	runs      int
	events    int
	ratios    []float64
	bento     string
	emulator  string
	redis     string
	only      map[string]bool
	redeliver float64
	save      string
	load      string
	profile   string
	// The soak (--only soak, or its short version with --quick).
	soakKeys                    int
	soakFor, soakTerm, soakKill time.Duration
	postgres                    string
}

// sections the benchmark can run, in order.
var sectionNames = []string{"broker", "pipeline", "latency", "replicas", "memory", "redis", "soak"}

// onDemand are the sections a run without --only leaves out, unless
// --quick runs their short versions: they take too long to repeat with
// every report.
var onDemand = []string{"soak"}

func parseConfig(args []string, stderr io.Writer) (config, error) {
	var c config
	var only, ratios string
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.BoolVar(&c.quick, "quick", false, "tiny counts, one run, no files written unless --out/--plots are given: a smoke test for CI")
	fs.StringVar(&c.out, "out", "", "write the report here (default BENCHMARKS.md; empty with --quick)")
	fs.StringVar(&c.plots, "plots", "", "write PNG plots into this folder (default docs/bench; empty with --quick)")
	fs.IntVar(&c.runs, "runs", 0, "runs of every measurement; the report gives the median (default 3; 1 with --quick)")
	fs.IntVar(&c.events, "events", 0, "logical events per pipeline run (default 100000; 2000 with --quick)")
	fs.StringVar(&ratios, "ratios", "", "comma-separated shares of events republished as a second copy (default 0,0.1,0.3,0.6; 0.3 with --quick)")
	fs.Float64Var(&c.redeliver, "redeliver", 0.02, "share of events whose first ack is lost (redelivered with the same message ID)")
	fs.StringVar(&c.bento, "bento", "", "path of a Bento binary (absent: Bento is reported as not measured)")
	fs.StringVar(&c.emulator, "emulator", defaultEmulator, "Google's Pub/Sub emulator launcher")
	fs.StringVar(&c.redis, "redis-server", "redis-server", "redis-server binary")
	fs.StringVar(&c.save, "save", "", "also save the measurements as JSON here")
	fs.StringVar(&c.load, "load", "", "measure nothing: draw the report and plots from measurements saved with --save")
	fs.StringVar(&c.profile, "profile", "", "sample the pipeline section's consumers with Linux perf at 30% copies; perf.data files and summary.txt go in this folder")
	fs.StringVar(&only, "only", "", "comma-separated sections to run: "+strings.Join(sectionNames, ", ")+" (default all but "+strings.Join(onDemand, ", ")+", which --quick runs short)")
	fs.IntVar(&c.soakKeys, "soak-keys", 0, "unique keys the soak publishes (default 1000000; 20000 with --quick)")
	fs.DurationVar(&c.soakFor, "soak-for", 0, "time the soak's publishing is spread over (default 10m; 30s with --quick)")
	fs.DurationVar(&c.soakTerm, "soak-term", 0, "the soak stops the pipeline with SIGTERM this often (default 30s; 10s with --quick)")
	fs.DurationVar(&c.soakKill, "soak-kill", 0, "the soak kills the pipeline with SIGKILL this often (default 45s; 15s with --quick)")
	fs.StringVar(&c.postgres, "postgres", os.Getenv("DEDUPFLOW_POSTGRES_URL"), "PostgreSQL URL of the soak's sink (default $DEDUPFLOW_POSTGRES_URL)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["out"] && !c.quick {
		c.out = "BENCHMARKS.md"
	}
	if !set["plots"] && !c.quick {
		c.plots = filepath.Join("docs", "bench")
	}
	if c.runs == 0 {
		c.runs = map[bool]int{true: 1, false: 3}[c.quick]
	}
	if c.events == 0 {
		c.events = map[bool]int{true: 2000, false: 100_000}[c.quick]
	}
	quickOr := func(v *time.Duration, long, short time.Duration) {
		if *v == 0 {
			*v = map[bool]time.Duration{true: short, false: long}[c.quick]
		}
	}
	quickOr(&c.soakFor, 10*time.Minute, 30*time.Second)
	quickOr(&c.soakTerm, 30*time.Second, 10*time.Second)
	quickOr(&c.soakKill, 45*time.Second, 15*time.Second)
	if c.soakKeys == 0 {
		c.soakKeys = map[bool]int{true: 20_000, false: 1_000_000}[c.quick]
	}
	if c.soakKeys < 10 || c.soakFor < time.Second || c.soakTerm < time.Second || c.soakKill < time.Second {
		return c, fmt.Errorf("--soak-keys %d must be at least 10, and --soak-for %v, --soak-term %v, --soak-kill %v at least 1s",
			c.soakKeys, c.soakFor, c.soakTerm, c.soakKill)
	}
	if c.runs < 1 || c.events < 10 {
		return c, fmt.Errorf("--runs %d and --events %d must be at least 1 and 10", c.runs, c.events)
	}
	if !(c.redeliver >= 0 && c.redeliver <= 1) {
		return c, fmt.Errorf("--redeliver %v must be between 0 and 1", c.redeliver)
	}
	if ratios == "" {
		ratios = map[bool]string{true: "0.3", false: "0,0.1,0.3,0.6"}[c.quick]
	}
	for _, s := range strings.Split(ratios, ",") {
		var r float64
		if _, err := fmt.Sscanf(strings.TrimSpace(s), "%g", &r); err != nil || !(r >= 0 && r <= 1) {
			return c, fmt.Errorf("--ratios: %q is not a share between 0 and 1", s)
		}
		c.ratios = append(c.ratios, r)
	}
	c.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		if !contains(sectionNames, s) {
			return c, fmt.Errorf("--only: unknown section %q (want %s)", s, strings.Join(sectionNames, ", "))
		}
		c.only[s] = true
	}
	return c, nil
}

func contains(s []string, x string) bool {
	for _, v := range s {
		if v == x {
			return true
		}
	}
	return false
}

// env is one benchmark run's shared state: no globals, everything hangs
// off it and is cleaned up by run.
type env struct {
	cfg            config
	root           string // the dedupflow module's folder, where its packages' benchmarks run
	self           string // this module's folder, where binaries are built
	tmp            string
	goBin          string
	stdout, stderr io.Writer
	machine        machine
	loadBefore     string
	loadAfter      string
	date           string // when the measurements started
	dedupflowBin   string
	bentoVersion   string   // "" when Bento did not run
	savedArgs      []string // the measuring run's arguments, with --load
	redisURL       string   // "" when Redis is absent
	redisPid       int      // its process, for its CPU time
	rows           []row
	earlier        []earlier // runs whose rows a partial run keeps (row.from indexes them from 1)
	kept           []row     // their rows, until settle
	absent         []string  // contenders not measured, and why
	failures       []string  // correctness failures and broken contenders
	soakSamples    []soakSample
	soakRestarts   []soakRestart
}

func (e *env) logf(format string, a ...any) { fmt.Fprintf(e.stderr, "bench: "+format+"\n", a...) }

// fail records a failure: the run goes on, so the report shows all of
// them, but exits non-zero.
func (e *env) fail(err error) {
	e.logf("FAIL: %v", err)
	e.failures = append(e.failures, err.Error())
}

func (e *env) markAbsent(what string) {
	e.logf("ABSENT: %s", what)
	e.absent = append(e.absent, what)
}

func (e *env) wants(section string) bool {
	if len(e.cfg.only) == 0 {
		return e.cfg.quick || !contains(onDemand, section)
	}
	return e.cfg.only[section]
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseConfig(args, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	e := &env{cfg: cfg, stdout: stdout, stderr: stderr}
	if cfg.load != "" {
		if err := e.load(cfg.load); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		if err := e.writeOutputs(); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
		return 0
	}
	if err := e.setup(ctx); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	defer os.RemoveAll(e.tmp)
	if err := e.mergeEarlier(); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if err := e.measureAll(ctx); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	e.loadAfter = loadAverage()
	e.settle()
	for _, path := range []string{cfg.save, cfg.resultsPath()} {
		if path == "" {
			continue
		}
		if err := e.save(path); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	}
	if err := e.writeOutputs(); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 1
	}
	if len(e.failures) > 0 {
		fmt.Fprintf(stderr, "bench: FAILED: %d failure(s):\n  %s\n", len(e.failures), strings.Join(e.failures, "\n  "))
		return 1
	}
	fmt.Fprintln(stderr, "bench: ok: every contender that ran was correct")
	return 0
}

func (e *env) setup(ctx context.Context) error {
	var err error
	if e.goBin, err = exec.LookPath("go"); err != nil {
		return fmt.Errorf("the go command is needed to build the pipeline and run package benchmarks: %w", err)
	}
	// The bench is a module of its own, so that what only it uses stays out
	// of the library's go.mod; it builds and measures the dedupflow module
	// that its go.mod replaces with the folder above.
	out, err := exec.CommandContext(ctx, e.goBin, "list", "-m", "-f", "{{.Dir}}", dedupflowModule).Output()
	if err != nil {
		return fmt.Errorf("find the dedupflow module (run the benchmark as go -C bench run . from the repository): %w", err)
	}
	e.root = strings.TrimSpace(string(out))
	if e.self, err = os.Getwd(); err != nil {
		return fmt.Errorf("bench module folder: %w", err)
	}
	if e.tmp, err = os.MkdirTemp("", "dedupflow-bench-"); err != nil {
		return fmt.Errorf("make scratch folder: %w", err)
	}
	e.machine = readMachine()
	e.loadBefore = loadAverage()
	e.date = time.Now().UTC().Format("2006-01-02 15:04 UTC")
	e.logf("machine: %s; load before: %s", e.machine, e.loadBefore)
	return nil
}

// measureAll runs the selected sections, interleaving contenders within
// each run so that load that changes during the run hits all of them.
func (e *env) measureAll(ctx context.Context) error {
	if e.wants("pipeline") || e.wants("memory") || e.wants("redis") {
		stop, err := e.startRedis(ctx)
		if err != nil {
			return err
		}
		defer stop()
	}
	steps := []struct {
		name string
		f    func(context.Context) error
	}{
		{"broker", e.benchBroker},
		{"pipeline", e.benchPipelines},
		{"latency", e.benchLatency},
		{"replicas", e.benchReplicas},
		{"memory", e.benchMemory},
		{"redis", e.benchRedis},
		{"soak", e.benchSoak},
	}
	for _, s := range steps {
		if !e.wants(s.name) {
			continue
		}
		e.logf("== %s", s.name)
		if err := s.f(ctx); err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("interrupted during %s: %w", s.name, ctx.Err())
			}
			e.fail(fmt.Errorf("%s: %w", s.name, err))
		}
	}
	return nil
}

// startRedis starts a private redis-server, or records Redis as absent.
func (e *env) startRedis(ctx context.Context) (stop func(), err error) {
	bin, err := exec.LookPath(e.cfg.redis)
	if err != nil {
		e.markAbsent(fmt.Sprintf("Redis: %s not found (Debian: apt-get install redis-server); the Redis store and the SET NX PX peer were not measured", e.cfg.redis))
		return func() {}, nil
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	ch, err := startChild("redis-server", filepath.Join(e.tmp, "redis.log"), e.tmp, nil, bin,
		"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", e.tmp)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitPort(ctx, ch, addr, 20*time.Second); err != nil {
		ch.kill()
		return nil, err
	}
	e.redisURL = "redis://" + addr + "/0"
	e.redisPid = ch.cmd.Process.Pid
	e.logf("redis-server on %s", addr)
	return func() { _ = ch.stop(5 * time.Second) }, nil
}
