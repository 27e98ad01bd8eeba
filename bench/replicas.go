package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"
)

// Names of the replica section's rows.
const (
	nameRepAll     = "dedupflow pipelines, all replicas"
	nameRepCPU     = "pipelines' CPU per message in (all replicas)"
	nameRepCmds    = "Redis commands per message in (all nodes)"
	nameRepReads   = "Redis reads per message in (all nodes; ≥ round trips)"
	nameRepNet     = "Redis network per message in (all nodes, in + out)"
	nameRepRedis   = "Redis CPU per message in (all nodes)"
	nameRepMem     = "Redis memory per key after the run (all nodes)"
	clusterMasters = 3
)

func replicaName(i int) string    { return fmt.Sprintf("replica %d", i+1) }
func replicaCPUName(i int) string { return fmt.Sprintf("replica %d CPU per message it received", i+1) }
func nodeCPUName(i int) string    { return fmt.Sprintf("Redis node %d CPU per message in", i+1) }
func replicasLabel(n int) string {
	if n == 1 {
		return "1 replica"
	}
	return fmt.Sprintf("%d replicas", n)
}

// benchReplicas runs 1, 2 and 4 pipeline replicas on one subscription,
// sharing their horizon in a Redis Cluster of three masters started here,
// on the 30% workload, and records what each replica and each node spends
// per message. On a small machine the replicas and the nodes share the same
// cores, so these are costs, not speedups.
func (e *env) benchReplicas(ctx context.Context) error {
	counts := []int{1, 2, 4}
	if e.cfg.quick {
		counts = []int{2}
	}
	cl, err := e.startCluster(ctx, clusterMasters)
	var absent errAbsent
	if errors.As(err, &absent) {
		e.markAbsent(absent.what)
		return nil
	}
	if err != nil {
		return err
	}
	defer cl.stop()
	bin, err := e.buildPipeline(ctx)
	if err != nil {
		return err
	}
	quiet := 2 * time.Second
	if e.cfg.quick {
		quiet = 300 * time.Millisecond
	}
	type key struct {
		group, name string
	}
	vals := map[key][]float64{}
	notes := map[key]string{}
	var order []key
	put := func(group, name string, v float64, note string) {
		k := key{group, name}
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = append(vals[k], v)
		if note != "" {
			notes[k] = note
		}
	}
	var count string
	for run := range e.cfg.runs {
		for _, n := range counts {
			group := replicasLabel(n)
			prefix := fmt.Sprintf("rep%d-%d:", n, run)
			c := dedupflowConsumer(bin, "Redis Cluster", func(runEnv) string { return cl.url(prefix) })
			wl := workload{events: e.cfg.events, dupRatio: 0.3, redeliverRatio: e.cfg.redeliver, payload: 100,
				spread: 2000, seed: uint64(7000 + 10*run + n), keyPrefix: fmt.Sprintf("rep%d-%d", n, run)}
			total, copies, _ := countsOf(wl)
			timeout := time.Minute + time.Duration(total/300)*time.Second
			dir, err := os.MkdirTemp(e.tmp, "replicas-")
			if err != nil {
				return fmt.Errorf("make run folder: %w", err)
			}
			before, err := cl.snapshot(ctx)
			if err != nil {
				return err
			}
			s, err := measurePipeline(ctx, c, n, wl, dir, timeout, quiet, nil)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				e.fail(fmt.Errorf("replicas: run %d, %s: %w", run+1, group, err))
				continue
			}
			after, err := cl.snapshot(ctx)
			if err != nil {
				return err
			}
			if err := cl.flush(ctx); err != nil {
				return err
			}
			count = fmt.Sprintf("%s events, %s msgs (%s copies) + ~%s redeliveries, one subscription",
				inum(wl.events), inum(total), inum(copies), inum(s.injected))
			in := float64(s.messagesIn)
			put(group, nameRepAll, s.rate, "")
			var cpu time.Duration
			var got []string
			for i, p := range s.procs {
				recv := p.stats.received()
				cpu += p.cpu
				got = append(got, fmt.Sprintf("%.0f", recv))
				put(group, replicaName(i), recv/s.elapsed.Seconds(), "messages it received ÷ the run's time; last run's own counters: "+p.stats.String())
				if recv > 0 {
					put(group, replicaCPUName(i), us(p.cpu)/recv, "")
				}
			}
			put(group, nameRepCPU, us(cpu)/in, "")
			var total2 nodeStats
			total2.calls = map[string]int64{}
			for i := range cl.nodes {
				d := after[i].sub(before[i])
				d.commands -= d.calls["info"] // the bench's own INFO
				delete(d.calls, "info")
				put(group, nodeCPUName(i), us(d.cpu)/in, fmt.Sprintf("last run: %.2f commands, %.2f reads per message in at this node",
					float64(d.commands)/in, float64(d.reads)/in))
				total2.commands += d.commands
				total2.reads += d.reads
				total2.netIn += d.netIn
				total2.netOut += d.netOut
				total2.cpu += d.cpu
				total2.keys += after[i].keys
				total2.usedMemory += d.usedMemory
				for k, v := range d.calls {
					total2.calls[k] += v
				}
			}
			put(group, nameRepCmds, float64(total2.commands)/in, "last run: "+perMessage(total2.calls, in))
			put(group, nameRepReads, float64(total2.reads)/in, "read events the servers handled: each client pipeline (split by node) arrives in one or more")
			put(group, nameRepNet, float64(total2.netIn+total2.netOut)/in,
				fmt.Sprintf("last run: %.0f B in + %.0f B out per message in", float64(total2.netIn)/in, float64(total2.netOut)/in))
			put(group, nameRepRedis, us(total2.cpu)/in, "")
			if total2.keys > 0 {
				put(group, nameRepMem, float64(total2.usedMemory)/float64(total2.keys),
					fmt.Sprintf("used_memory growth ÷ %d keys held after the run", total2.keys))
			}
			e.logf("run %d %-10s %s msg/s in %v, received per replica %s, pipelines %.1f µs/msg, Redis %.1f µs/msg, %.2f commands/msg, %.2f reads/msg",
				run+1, group, num(s.rate), s.elapsed.Round(time.Millisecond), strings.Join(got, "/"), us(cpu)/in, us(total2.cpu)/in,
				float64(total2.commands)/in, float64(total2.reads)/in)
		}
	}
	units := map[string]string{nameRepAll: "msg/s in", nameRepCPU: "µs CPU/msg", nameRepCmds: "commands/msg",
		nameRepReads: "reads/msg", nameRepNet: "B/msg", nameRepRedis: "µs CPU/msg", nameRepMem: "B/key"}
	for _, k := range order {
		u, ok := units[k.name]
		switch {
		case ok:
		case strings.Contains(k.name, "CPU"):
			u = "µs CPU/msg"
		default:
			u = "msg/s"
		}
		e.add(row{section: "replicas", group: k.group, name: k.name, ours: k.name == nameRepAll, count: count,
			unit: u, values: vals[k], note: notes[k]})
	}
	return nil
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// perMessage lists commands by name, per message in, most frequent first.
func perMessage(calls map[string]int64, in float64) string {
	names := make([]string, 0, len(calls))
	for k := range calls {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return calls[names[i]] > calls[names[j]] })
	var parts []string
	for _, k := range names {
		if x := float64(calls[k]) / in; x >= 0.001 {
			parts = append(parts, fmt.Sprintf("%s %.3f", strings.ToUpper(k), x))
		}
	}
	return strings.Join(parts, ", ") + " per message in"
}
