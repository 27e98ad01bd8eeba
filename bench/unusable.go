package main

import (
	"context"
	"fmt"
	"os"
	"time"
)

// Names of the unusable-messages rows.
const (
	nameUnusableClean  = "dedupflow pipeline (mem store), every event time well-formed"
	nameUnusableSome   = "dedupflow pipeline (mem store), every 10th event time malformed"
	nameGateClean      = "gate.PassBatch, a batch of 1,000, clean"
	nameGateUnusable   = "gate.PassBatch, a batch of 1,000, 40 unusable"
	groupUnusableRun   = "1,000 messages, no dead-letter topic"
	unusableEvents     = 1000 // as many as one batch holds
	groupUnusableBatch = "one batch, in process"
)

// benchUnusable measures what messages the pipeline cannot judge cost the
// good ones beside them when there is no dead-letter topic to put them
// in: through the binary, the time until every good message is out, beside
// the same run with none unusable; and in process, the gate's own
// benchmark of a batch of 1,000 with 40 unusable, beside a clean one.
func (e *env) benchUnusable(ctx context.Context, bin string, quiet time.Duration) error {
	c := dedupflowConsumer(bin, "mem store event time", memState, "--timestamp-attribute", attrTime)
	stamp := time.Now().UnixMilli()
	secs := map[string][]float64{}
	for run := range e.cfg.runs {
		for _, v := range []struct {
			name  string
			every int
		}{{nameUnusableClean, 0}, {nameUnusableSome, 10}} {
			wl := workload{events: unusableEvents, payload: 100, seed: uint64(run + 1), stamp: stamp, unusableEvery: v.every,
				keyPrefix: fmt.Sprintf("u%d-%d", run, v.every)}
			dir, err := os.MkdirTemp(e.tmp, "unusable-")
			if err != nil {
				return fmt.Errorf("make run folder: %w", err)
			}
			s, err := measurePipeline(ctx, named(c, v.name), 1, wl, dir, time.Minute, quiet, nil)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				e.fail(fmt.Errorf("run %d, unusable messages: %w", run+1, err))
				continue
			}
			secs[v.name] = append(secs[v.name], s.elapsed.Seconds())
			e.logf("run %d %-62s %d good events out in %v; %s", run+1, v.name, wl.good(), s.elapsed.Round(time.Millisecond), s.stats)
		}
	}
	for _, name := range []string{nameUnusableClean, nameUnusableSome} {
		if len(secs[name]) == 0 {
			continue
		}
		r := row{section: "unusable", group: groupUnusableRun, name: name, ours: true, unit: "s", values: secs[name],
			count: "1,000 events, no copies or redeliveries; time until every event is out"}
		if name == nameUnusableSome {
			r.peer = nameUnusableClean
			r.count = "1,000 events of which 100 carry a malformed event time (nacked, never emitted), no copies or redeliveries; time until the 900 good ones are out"
		}
		e.add(r)
	}

	benchtime := "2s"
	if e.cfg.quick {
		benchtime = "20x"
	}
	lines, err := goBench(ctx, e, "gate-unusable", "./internal/gate", "^BenchmarkPassBatchUnusable$", benchtime, e.cfg.runs, nil)
	if err != nil {
		return err
	}
	for _, b := range []struct{ sub, name string }{{"clean", nameGateClean}, {"40-unusable", nameGateUnusable}} {
		ns := metricRuns(lines, "BenchmarkPassBatchUnusable/"+b.sub, "ns/op")
		if len(ns) == 0 {
			e.fail(fmt.Errorf("unusable messages: no ns/op result for BenchmarkPassBatchUnusable/%s", b.sub))
			continue
		}
		us := make([]float64, len(ns))
		for i, v := range ns {
			us[i] = v / 1e3
		}
		r := row{section: "unusable", group: groupUnusableBatch, name: b.name, ours: true, unit: "µs/batch", values: us,
			count: "`go test -bench PassBatchUnusable ./internal/gate`: memory store, a no-op sink, new keys every batch"}
		if b.sub != "clean" {
			r.peer = nameGateClean
		}
		e.add(r)
	}
	return nil
}
