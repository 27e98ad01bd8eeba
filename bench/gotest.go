package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// benchLine is one result line of `go test -bench`: the benchmark's name
// without the GOMAXPROCS suffix, and its metrics by unit.
type benchLine struct {
	name    string
	metrics map[string]float64
}

var procSuffix = regexp.MustCompile(`-\d+$`)

// goBench runs a package's Go benchmark as a child process (so it is
// stopped with everything else on SIGINT) and parses its result lines.
// Reusing the packages' own benchmarks keeps one definition of each
// measurement: the broker's end-to-end run, store/mem's steady-state
// insert, store/redis's claim against a hand-rolled SET NX.
func goBench(ctx context.Context, e *env, label, pkg, pattern, benchtime string, count int, extraEnv []string) ([]benchLine, error) {
	logPath := filepath.Join(e.tmp, "gotest-"+label+".log")
	args := []string{"test", "-run", "^$", "-bench", pattern, "-benchtime", benchtime,
		"-count", strconv.Itoa(count), "-timeout", "60m", pkg}
	fmt.Fprintf(e.stderr, "bench: go %s\n", strings.Join(args, " "))
	ch, err := startChild("go test "+pkg, logPath, e.root, extraEnv, e.goBin, args...)
	if err != nil {
		return nil, err
	}
	select {
	case <-ch.done:
	case <-ctx.Done():
		ch.kill()
		return nil, ctx.Err()
	}
	if ch.err != nil {
		return nil, fmt.Errorf("go test %s: %w (log: %s)", pkg, ch.err, ch.tail())
	}
	f, err := os.Open(logPath)
	if err != nil {
		return nil, fmt.Errorf("read go test output: %w", err)
	}
	defer f.Close()
	var out []benchLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		bl := benchLine{name: procSuffix.ReplaceAllString(fields[0], ""), metrics: map[string]float64{}}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			bl.metrics[fields[i+1]] = v
		}
		out = append(out, bl)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read go test output: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("go test %s -bench %s printed no results (log: %s)", pkg, pattern, ch.tail())
	}
	return out, nil
}

// metricRuns collects one metric of the named benchmark over its -count runs.
func metricRuns(lines []benchLine, name, unit string) []float64 {
	var v []float64
	for _, l := range lines {
		if l.name == name {
			if x, ok := l.metrics[unit]; ok {
				v = append(v, x)
			}
		}
	}
	return v
}
