package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// build compiles a package, named by its import path, into the scratch
// folder; this module's go.mod resolves dedupflow's packages.
func (e *env) build(ctx context.Context, name, pkg string) (string, error) {
	bin := filepath.Join(e.tmp, name)
	e.logf("building: go build -o %s %s", bin, pkg)
	b, err := startChild("go build "+pkg, filepath.Join(e.tmp, "build-"+name+".log"), e.self, nil, e.goBin, "build", "-o", bin, pkg)
	if err != nil {
		return "", err
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		b.kill()
		return "", ctx.Err()
	}
	if b.err != nil {
		return "", fmt.Errorf("build %s: %w (log: %s)", pkg, b.err, b.tail())
	}
	return bin, nil
}

// buildPipeline builds the dedupflow binary once per bench run.
func (e *env) buildPipeline(ctx context.Context) (string, error) {
	if e.dedupflowBin != "" {
		return e.dedupflowBin, nil
	}
	bin, err := e.build(ctx, "dedupflow", dedupflowModule+"/cmd/dedupflow")
	if err != nil {
		return "", err
	}
	e.dedupflowBin = bin
	return bin, nil
}

// redisCPU starts counting the bench's redis-server CPU: the returned
// function gives the CPU spent since. nil without a Redis.
func (e *env) redisCPU() func() (time.Duration, error) {
	if e.redisPid == 0 {
		return nil
	}
	pid := e.redisPid
	before, err := testenv.ProcessCPU(pid)
	if err != nil {
		return func() (time.Duration, error) { return 0, err }
	}
	return func() (time.Duration, error) {
		after, err := testenv.ProcessCPU(pid)
		return after - before, err
	}
}

// batchFloorOf names the batch path rows that the batch relay floor is the
// floor of, on the same receiver.
var batchFloorOf = map[string]bool{nameMem: true, nameDisk: true, nameRedis: true}

// addCPURows reports each consumer's CPU per message in, as a ratio to the
// relay floor's, in the report's CPU section; the batch path's rows also
// say their ratio to the batch relay floor.
func (e *env) addCPURows(group, count string, cpu map[[2]string][]float64) {
	batchFloor := row{values: cpu[[2]string{group, nameFloorBatch}]}
	for _, name := range []string{nameFloor, nameFloorClient, nameFloorBatch, nameMem, nameMemClient, nameDisk, nameDiskClient, nameRedis, nameRedisClient,
		nameRedisServer, nameRedisServerClient, nameBento, nameBentoBatched} {
		v := cpu[[2]string{group, name}]
		if len(v) == 0 {
			continue
		}
		r := row{section: "cpu", group: group, name: name, ours: strings.HasPrefix(name, "dedupflow"),
			count: count, unit: "µs CPU/msg", values: v, peer: nameFloor}
		switch name {
		case nameFloor:
			r.peer = ""
		case nameFloorClient:
			r.note = "the same relay publishing through pubsub.Publisher instead of the batched Publish RPC"
		case nameFloorBatch:
			r.note = "the same relay receiving through pubsubio/pull, a batch at a time, each batch's first copies in one Publish RPC, acked after it"
		case nameRedis, nameRedisClient:
			r.note = "the pipeline process only"
		case nameRedisServer, nameRedisServerClient:
			r.peer = ""
			r.count = "the bench's redis-server during the Redis store runs (/proc/PID/stat), per message in"
		}
		if batchFloorOf[name] && len(batchFloor.values) > 0 {
			r.note = strings.TrimPrefix(r.note+fmt.Sprintf("; pipeline ÷ batch relay floor: %.2f×", paired(r, batchFloor)), "; ")
		}
		e.add(r)
	}
}

// cpuTargets are the bounds on CPU per message over a relay floor: the
// official client's, and the batch relay's on the pipeline's own receiver.
var cpuTargets = []struct {
	name  string
	label string
	floor string
	max   float64
}{
	{nameMem, "memory store", nameFloor, 0.5},
	{nameDisk, "disk store", nameFloor, 0.6},
	{nameRedis, "Redis store (pipeline process only)", nameFloor, 0.7},
	{nameMem, "memory store", nameFloorBatch, 1.2},
	{nameDisk, "disk store", nameFloorBatch, 1.2},
	{nameRedis, "Redis store (pipeline process only)", nameFloorBatch, 1.2},
}

// floorLabels name the floors in the Targets table.
var floorLabels = map[string]string{nameFloor: "the relay floor's", nameFloorBatch: "the batch relay floor's"}

// cpuTargetRows are the Targets table's lines for CPU per message.
func (e *env) cpuTargetRows(verdict func(bool) string) string {
	var b strings.Builder
	g := ratioLabel(0.3)
	for _, t := range cpuTargets {
		floor, okF := e.find("cpu", g, t.floor)
		r, ok := e.find("cpu", g, t.name)
		if !ok || !okF || r.from != floor.from {
			fmt.Fprintf(&b, "| %s, 30%% copies: CPU per message ≤ %.2f× %s | not measured | — |\n", t.label, t.max, floorLabels[t.floor])
			continue
		}
		x := paired(r, floor)
		extra := ""
		if t.name == nameRedis {
			if s, ok := e.find("cpu", g, nameRedisServer); ok {
				extra = fmt.Sprintf("; redis-server beside it: %.2f µs/msg (pipeline + server %.2f×)", s.median(),
					(r.median()+s.median())/floor.median())
				if c, ok := e.find("cpu", g, nameRedisServerClient); ok && c.from == s.from {
					extra += fmt.Sprintf(", beside --receiver client's %.2f", c.median())
				}
			}
		}
		fmt.Fprintf(&b, "| %s, 30%% copies: CPU per message ≤ %.2f× %s | %.1f vs %.1f µs/msg; per run %.2f×%s | %s |\n",
			t.label, t.max, floorLabels[t.floor], r.median(), floor.median(), x, extra, verdict(x <= t.max))
	}
	return b.String()
}

// paired is r's CPU over floor's: the median of the runs' ratios when both
// ran every run (each run measures every contender in turn, so a run's two
// figures share the machine's state of the moment), else the ratio of the
// medians.
func paired(r, floor row) float64 {
	if len(r.values) != len(floor.values) || r.from != floor.from {
		return r.median() / floor.median()
	}
	per := row{values: make([]float64, len(r.values))}
	for i, v := range r.values {
		per.values[i] = v / floor.values[i]
	}
	return per.median()
}
