package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// profiler samples the CPU of the pipeline section's consumers with Linux
// perf (the pipeline serves no /debug/pprof, and perf needs no change to
// the program measured): one perf.data per consumer and run, and a summary
// that spreads each consumer's measured CPU per message over the code it
// was spent in.
type profiler struct {
	dir  string
	perf string
	runs map[string][]profRun // by consumer name
}

type profRun struct {
	data      string
	cpuPerMsg float64 // µs, measured by the bench for this run
}

func newProfiler(dir string) (*profiler, error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, fmt.Errorf("--profile needs Linux perf (Debian: apt-get install linux-perf): %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("make profile folder: %w", err)
	}
	return &profiler{dir: dir, perf: perf, runs: map[string][]profRun{}}, nil
}

// attach starts sampling ch into path; the returned stop ends perf and
// waits until it has written its file.
func (p *profiler) attach(ch *child, path string) (stop func(), err error) {
	cmd := exec.Command(p.perf, "record", "-F", "499", "-g", "-o", path, "-p", strconv.Itoa(ch.cmd.Process.Pid))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start perf: %w", err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGINT)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	}, nil
}

// file names the perf data of one consumer's run.
func (p *profiler) file(name string, run int) string {
	slug := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(name))
	return filepath.Join(p.dir, fmt.Sprintf("%s-run%d.perf.data", strings.Trim(slug, "-"), run+1))
}

func (p *profiler) record(name, data string, cpuPerMsg float64) {
	p.runs[name] = append(p.runs[name], profRun{data, cpuPerMsg})
}

// buckets group symbols into the costs a reader can act on; the first
// prefix that matches wins.
var buckets = []struct{ name, prefix string }{
	{"GC (mark, sweep, write barriers)", "runtime.gc"},
	{"GC (mark, sweep, write barriers)", "runtime.scan"},
	{"GC (mark, sweep, write barriers)", "runtime.markBits"},
	{"GC (mark, sweep, write barriers)", "runtime.greyobject"},
	{"GC (mark, sweep, write barriers)", "runtime.findObject"},
	{"GC (mark, sweep, write barriers)", "runtime.wbBuf"},
	{"GC (mark, sweep, write barriers)", "runtime.bulkBarrier"},
	{"GC (mark, sweep, write barriers)", "runtime.(*mspan)"},
	{"GC (mark, sweep, write barriers)", "runtime.(*gcWork)"},
	{"GC (mark, sweep, write barriers)", "runtime.sweep"},
	{"allocation", "runtime.mallocgc"},
	{"allocation", "runtime.malloc"},
	{"allocation", "runtime.(*mcache)"},
	{"allocation", "runtime.(*mcentral)"},
	{"allocation", "runtime.(*mheap)"},
	{"allocation", "runtime.memclr"},
	{"allocation", "runtime.newobject"},
	{"allocation", "runtime.makeslice"},
	{"allocation", "runtime.growslice"},
	{"maps", "runtime.map"},
	{"maps", "internal/runtime/maps"},
	{"scheduler, goroutines, channels, locks", "runtime."},
	{"scheduler, goroutines, channels, locks", "sync."},
	{"scheduler, goroutines, channels, locks", "internal/sync"},
	{"kernel (syscalls, network, futex)", "[k]"},
	{"gRPC and HTTP/2", "google.golang.org/grpc"},
	{"gRPC and HTTP/2", "golang.org/x/net/http2"},
	{"protobuf", "google.golang.org/protobuf"},
	{"Pub/Sub client", "cloud.google.com/go/pubsub"},
	{"go-redis", "github.com/redis/go-redis"},
	{"Pebble", "github.com/cockroachdb/pebble"},
	{"prometheus", "github.com/prometheus"},
	{"dedupflow", "github.com/dedupflow/dedupflow"},
	{"hashing, encoding, strings", "crypto/"},
	{"hashing, encoding, strings", "hash/"},
	{"hashing, encoding, strings", "encoding/"},
	{"hashing, encoding, strings", "strconv."},
	{"hashing, encoding, strings", "strings."},
	{"hashing, encoding, strings", "bytes."},
	{"hashing, encoding, strings", "unicode/"},
	{"time", "time."},
	{"logging", "log/slog"},
	{"syscall wrappers", "syscall."},
	{"syscall wrappers", "internal/poll"},
	{"syscall wrappers", "net."},
	{"syscall wrappers", "os."},
}

func bucketOf(sym string) string {
	for _, b := range buckets {
		if strings.HasPrefix(sym, b.prefix) {
			return b.name
		}
	}
	return "other"
}

// selfShares reads a perf.data's flat profile: each bucket's share of the
// samples (self time, 0..1).
func (p *profiler) selfShares(ctx context.Context, data string) (map[string]float64, map[string]float64, error) {
	out, err := exec.CommandContext(ctx, p.perf, "report", "-i", data, "--stdio", "--no-children", "-g", "none",
		"--sort", "sym", "--percent-limit", "0.05").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("perf report %s: %w", data, err)
	}
	byBucket, bySym := map[string]float64{}, map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		// "    12.34%  [.] runtime.mallocgc" or "     1.00%  [k] do_syscall_64"
		f := strings.Fields(sc.Text())
		if len(f) < 3 || !strings.HasSuffix(f[0], "%") {
			continue
		}
		pct, err := strconv.ParseFloat(strings.TrimSuffix(f[0], "%"), 64)
		if err != nil {
			continue
		}
		sym := strings.Join(f[2:], " ")
		if f[1] == "[k]" {
			sym = "[k] " + sym
		}
		byBucket[bucketOf(sym)] += pct / 100
		bySym[sym] += pct / 100
	}
	return byBucket, bySym, sc.Err()
}

// summarize writes DIR/summary.txt: per consumer, µs of CPU per message in
// each bucket (median run's CPU × the bucket's share of samples, shares
// averaged over runs), and each dedupflow consumer's difference to the
// relay floor, largest first.
func (p *profiler) summarize(ctx context.Context) (string, error) {
	type prof struct {
		runs    int
		cpu     float64
		buckets map[string]float64 // µs per message
		syms    map[string]float64
	}
	profs := map[string]prof{}
	for name, runs := range p.runs {
		pr := prof{buckets: map[string]float64{}, syms: map[string]float64{}}
		var cpus []float64
		var shares []map[string]float64
		var symShares []map[string]float64
		for _, r := range runs {
			b, s, err := p.selfShares(ctx, r.data)
			if err != nil || len(b) == 0 {
				continue // perf wrote no samples for this run (it happens when the child ends first)
			}
			shares, symShares = append(shares, b), append(symShares, s)
			cpus = append(cpus, r.cpuPerMsg)
		}
		if len(cpus) == 0 {
			continue
		}
		for i := range shares {
			for k, v := range shares[i] {
				pr.buckets[k] += v / float64(len(shares))
			}
			for k, v := range symShares[i] {
				pr.syms[k] += v / float64(len(shares))
			}
		}
		pr.cpu, pr.runs = row{values: cpus}.median(), len(cpus)
		for k := range pr.buckets {
			pr.buckets[k] *= pr.cpu
		}
		for k := range pr.syms {
			pr.syms[k] *= pr.cpu
		}
		profs[name] = pr
	}
	var b strings.Builder
	names := make([]string, 0, len(profs))
	for n := range profs {
		names = append(names, n)
	}
	sort.Strings(names)
	floor, hasFloor := profs[nameFloor]
	for _, n := range names {
		pr := profs[n]
		fmt.Fprintf(&b, "== %s: %.1f µs CPU per message in (median of the %d profiled runs)\n", n, pr.cpu, pr.runs)
		above := hasFloor && n != nameFloor
		var base prof
		if above {
			base = floor
		}
		for _, r := range overFloor(pr.buckets, base.buckets) {
			if above {
				fmt.Fprintf(&b, "  %-42s %6.2f µs/msg (floor %5.2f, %+6.2f)\n", r.k, pr.buckets[r.k], floor.buckets[r.k], r.v)
			} else {
				fmt.Fprintf(&b, "  %-42s %6.2f µs/msg\n", r.k, r.v)
			}
		}
		syms := overFloor(pr.syms, base.syms)
		fmt.Fprintf(&b, "  top functions (self)%s:\n", map[bool]string{true: ", above the floor", false: ""}[above])
		for _, s := range syms[:min(15, len(syms))] {
			fmt.Fprintf(&b, "    %6.2f µs/msg  %s\n", s.v, s.k)
		}
	}
	path := filepath.Join(p.dir, "summary.txt")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write profile summary: %w", err)
	}
	return path, nil
}

// share is one bucket's or function's CPU per message.
type share struct {
	k string
	v float64
}

// overFloor is m less floor (nil: m as it is), largest first.
func overFloor(m, floor map[string]float64) []share {
	out := make([]share, 0, len(m))
	for k, v := range m {
		out = append(out, share{k, v - floor[k]})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].v > out[j].v })
	return out
}
