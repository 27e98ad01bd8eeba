package main

import (
	"context"
	"fmt"
)

// Names and group of the broker's restart rows.
const (
	groupRestart     = "restart to first delivery"
	nameRestartKill  = "dedupflow broker --data-dir, after SIGKILL"
	nameRestartClean = "dedupflow broker --data-dir, after SIGTERM"
)

// benchBrokerRestart runs broker/restart_bench_test.go's BenchmarkRestart:
// a broker process with a backlog queued, killed or stopped and started
// again, timed until a new subscriber gets its first message.
func (e *env) benchBrokerRestart(ctx context.Context) error {
	n := 1_000_000
	if e.cfg.quick {
		n = 2_000
	}
	lines, err := goBench(ctx, e, "broker-restart", "./broker", "^BenchmarkRestart$", "1x", e.cfg.runs,
		[]string{fmt.Sprintf("BROKER_BENCH_RESTART_N=%d", n)})
	if err != nil {
		return err
	}
	for _, k := range []struct{ prefix, name string }{{"kill", nameRestartKill}, {"clean", nameRestartClean}} {
		r := row{section: "broker", group: groupRestart, name: k.name, ours: true, unit: "s",
			count:  fmt.Sprintf("%s messages of 100 B + 1 attribute queued", inum(n)),
			values: metricRuns(lines, "BenchmarkRestart", k.prefix+"-first-s")}
		if serve := metricRuns(lines, "BenchmarkRestart", k.prefix+"-serve-s"); len(serve) > 0 {
			r.note = fmt.Sprintf("serving after %s s (median)", num(row{values: serve}.median()))
		}
		if len(r.values) == 0 {
			e.fail(fmt.Errorf("broker: no %s-first-s result of BenchmarkRestart", k.prefix))
			continue
		}
		e.add(r)
	}
	return nil
}
