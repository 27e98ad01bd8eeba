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

// addCPURows reports each consumer's CPU per message in, as a ratio to the
// relay floor's, in the report's CPU section.
func (e *env) addCPURows(group, count string, cpu map[[2]string][]float64) {
	for _, name := range []string{nameFloor, nameFloorClient, nameMem, nameMemClient, nameDisk, nameDiskClient, nameRedis, nameRedisClient,
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
		case nameRedis, nameRedisClient:
			r.note = "the pipeline process only"
		case nameRedisServer, nameRedisServerClient:
			r.peer = ""
			r.count = "the bench's redis-server during the Redis store runs (/proc/PID/stat), per message in"
		}
		e.add(r)
	}
}

// cpuTargets are the bounds on CPU per message over the relay floor.
var cpuTargets = []struct {
	name  string
	label string
	max   float64
}{
	{nameMem, "memory store", 0.5},
	{nameDisk, "disk store", 0.6},
	{nameRedis, "Redis store (pipeline process only)", 0.7},
}

// cpuTargetRows are the Targets table's lines for CPU per message.
func (e *env) cpuTargetRows(verdict func(bool) string) string {
	var b strings.Builder
	g := ratioLabel(0.3)
	floor, okF := e.find("cpu", g, nameFloor)
	for _, t := range cpuTargets {
		r, ok := e.find("cpu", g, t.name)
		if !ok || !okF || r.from != floor.from {
			fmt.Fprintf(&b, "| %s, 30%% copies: CPU per message ≤ %.2f× the relay floor's | not measured | — |\n", t.label, t.max)
			continue
		}
		x := r.median() / floor.median()
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
		fmt.Fprintf(&b, "| %s, 30%% copies: CPU per message ≤ %.2f× the relay floor's | %.1f vs %.1f µs/msg = %.2f×%s | %s |\n",
			t.label, t.max, r.median(), floor.median(), x, extra, verdict(x <= t.max))
	}
	return b.String()
}
