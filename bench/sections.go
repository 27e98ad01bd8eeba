package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// benchBroker runs broker/bench_test.go's BenchmarkEndToEnd against our
// broker, pstest and, when installed, Google's emulator, which the bench
// starts itself and stops afterwards.
func (e *env) benchBroker(ctx context.Context) error {
	n, emuN, psN := 200_000, 50_000, 2_000
	if e.cfg.quick {
		n, emuN, psN = 2_000, 500, 100
	}
	vars := []string{fmt.Sprintf("BROKER_BENCH_N=%d", n), fmt.Sprintf("BROKER_BENCH_EMULATOR_N=%d", emuN),
		fmt.Sprintf("BROKER_BENCH_PSTEST_N=%d", psN)}
	subs := []string{"ours-memory", "ours-filter-half", "pstest"}
	if _, err := os.Stat(e.cfg.emulator); err != nil {
		e.markAbsent(fmt.Sprintf("Google's Pub/Sub emulator: %s not found (Debian: apt-get install google-cloud-cli-pubsub-emulator openjdk-17-jre-headless); the broker was compared with pstest only", e.cfg.emulator))
	} else {
		addr, stop, err := e.startEmulator(ctx)
		if err != nil {
			return err
		}
		defer stop()
		vars = append(vars, "DEDUPFLOW_EMULATOR_HOST="+addr)
		subs = append(subs, "emulator")
	}
	lines, err := goBench(ctx, e, "broker", "./broker", "^BenchmarkEndToEnd$/^("+strings.Join(subs, "|")+")$", "1x", e.cfg.runs, vars)
	if err != nil {
		return err
	}
	const ours = "dedupflow broker (in memory)"
	names := map[string]string{"ours-memory": ours, "emulator": "Google Pub/Sub emulator", "pstest": "pstest (in process)",
		"ours-filter-half": "dedupflow broker, a filter passing half"}
	sizes := map[string]int{"ours-memory": n, "ours-filter-half": n, "emulator": emuN, "pstest": psN}
	for _, m := range []struct{ unit, group string }{{"pub-msg/s", "publish"}, {"recv-msg/s", "streaming pull + ack"}} {
		for _, s := range subs {
			r := row{section: "broker", group: m.group, name: names[s], ours: s == "ours-memory",
				count: fmt.Sprintf("%s messages of 100 B + 2 attributes", inum(sizes[s])), unit: "msg/s",
				values: metricRuns(lines, "BenchmarkEndToEnd/"+s, m.unit)}
			switch {
			case s == "ours-filter-half":
				r.peer = ours // what the filter costs; streaming pull counts the half delivered
			case r.ours && contains(subs, "emulator"):
				r.peer = names["emulator"]
			case r.ours:
				r.peer = names["pstest"]
			default:
				r.peer = ours
			}
			if len(r.values) == 0 {
				e.fail(fmt.Errorf("broker: no %s result for %s", m.unit, s))
				continue
			}
			e.add(r)
		}
	}
	if err := e.benchSchemas(ctx, n); err != nil {
		return err
	}
	return e.benchBrokerRestart(ctx)
}

// benchSchemas runs BenchmarkSchemaPublish: what checking every message
// against an Avro schema costs a publish, beside the same topic without one.
func (e *env) benchSchemas(ctx context.Context, n int) error {
	lines, err := goBench(ctx, e, "broker-schemas", "./broker", "^BenchmarkSchemaPublish$", "1x", e.cfg.runs,
		[]string{fmt.Sprintf("BROKER_BENCH_N=%d", n)})
	if err != nil {
		return err
	}
	const plain = "dedupflow broker, topic without a schema"
	for _, s := range []struct{ sub, name string }{
		{"no-schema", plain},
		{"avro-json", "dedupflow broker, Avro schema, JSON encoding"},
		{"avro-binary", "dedupflow broker, Avro schema, binary encoding"},
	} {
		r := row{section: "broker", group: "publish, schema-checked", name: s.name,
			ours: true, count: fmt.Sprintf("%s messages of a 5-field record, raw gRPC, 1000 per request", inum(n)), unit: "msg/s",
			values: metricRuns(lines, "BenchmarkSchemaPublish/"+s.sub, "pub-msg/s")}
		if s.sub != "no-schema" {
			r.peer = plain
		}
		if len(r.values) == 0 {
			e.fail(fmt.Errorf("broker: no pub-msg/s result for schema publish %s", s.sub))
			continue
		}
		e.add(r)
	}
	return nil
}

func (e *env) startEmulator(ctx context.Context) (addr string, stop func(), err error) {
	port, err := freePort()
	if err != nil {
		return "", nil, err
	}
	ch, err := startChild("pubsub emulator", filepath.Join(e.tmp, "emulator.log"), e.tmp, nil, e.cfg.emulator,
		"--host=127.0.0.1", fmt.Sprintf("--port=%d", port))
	if err != nil {
		return "", nil, err
	}
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	if err := waitPort(ctx, ch, addr, 90*time.Second); err != nil {
		ch.kill()
		return "", nil, err
	}
	e.logf("pubsub emulator on %s", addr)
	return addr, func() { _ = ch.stop(10 * time.Second) }, nil
}

// Names of the pipeline rows.
const (
	nameMem          = "dedupflow pipeline (mem store)"
	nameDisk         = "dedupflow pipeline (disk store)"
	nameRedis        = "dedupflow pipeline (Redis store)"
	nameBento        = "Bento dedupe (memory cache)"
	nameBentoBatched = "Bento dedupe, input batches of 500"
	nameNATS         = "NATS JetStream Nats-Msg-Id (publish side)"
	nameFloor        = "relay floor (official client, seen-map, not crash-safe)"
	nameFloorClient  = "relay floor with the client's Publisher"
	// nameFloorBatch is the relay floor on the pipeline's own receiver
	// (pubsubio/pull, a batch at a time): the floor of the default path.
	nameFloorBatch  = "batch relay floor (pubsubio/pull, seen-map, not crash-safe)"
	nameRedisServer = "redis-server, beside the Redis store row"
	// The official client's Receive, one message at a time (--receiver
	// client), beside each store's row of the default batch path.
	nameMemClient   = "dedupflow pipeline (mem store, --receiver client)"
	nameDiskClient  = "dedupflow pipeline (disk store, --receiver client)"
	nameRedisClient = "dedupflow pipeline (Redis store, --receiver client)"
	// nameRedisServerClient is redis-server's CPU during the client path's runs.
	nameRedisServerClient = "redis-server, beside the Redis store --receiver client row"
)

// clientOf is the default (batch) path's row each client path row is
// compared with.
var clientOf = map[string]string{nameMemClient: nameMem, nameDiskClient: nameDisk, nameRedisClient: nameRedis}

// redisServerRow names the redis-server CPU row of each Redis store row.
var redisServerRow = map[string]string{nameRedis: nameRedisServer, nameRedisClient: nameRedisServerClient}

// benchPipelines measures every dedup contender on the same workloads.
// The disk and Redis stores run at the 30% ratio only: they answer "what
// does a durable or shared horizon cost", not how dedup scales with copies.
func (e *env) benchPipelines(ctx context.Context) error {
	bin, floorBin, err := e.buildContenders(ctx)
	if err != nil {
		return err
	}

	type entry struct {
		c       consumer
		allDups bool // every ratio, or 30% only
	}
	var cs []entry
	cs = append(cs, entry{relayFloorConsumer(floorBin, nameFloor, "client", "batched"), true},
		entry{relayFloorConsumer(floorBin, nameFloorClient, "client", "client"), false},
		entry{relayFloorConsumer(floorBin, nameFloorBatch, "batch", "batched"), false})
	cs = append(cs, entry{named(dedupflowConsumer(bin, "mem store", memState), nameMem), true},
		entry{named(dedupflowConsumer(bin, "disk store", diskState), nameDisk), false},
		entry{named(dedupflowConsumer(bin, "mem store client", memState, client...), nameMemClient), false},
		entry{named(dedupflowConsumer(bin, "disk store client", diskState, client...), nameDiskClient), false})
	if e.redisURL != "" {
		redisState := func(env runEnv) string { return e.redisURL + "?prefix=" + filepath.Base(env.dir) + ":" }
		cs = append(cs, entry{named(dedupflowConsumer(bin, "Redis store", redisState), nameRedis), false},
			entry{named(dedupflowConsumer(bin, "Redis store client", redisState, client...), nameRedisClient), false})
	}
	if e.cfg.bento == "" {
		e.markAbsent("Bento: no binary given (--bento PATH), so its dedupe was not measured; its module is not served by the Go module proxy here, so a binary has to be built outside this repository")
	} else if st, err := os.Stat(e.cfg.bento); err != nil || st.IsDir() {
		e.markAbsent(fmt.Sprintf("Bento: --bento %s is not a file (%v); its dedupe was not measured", e.cfg.bento, err))
	} else {
		cs = append(cs, entry{bentoConsumer(e.cfg.bento, nameBento, 0), true},
			entry{bentoConsumer(e.cfg.bento, nameBentoBatched, 500), true})
		e.bentoVersion = bentoVersion(ctx, e.cfg.bento)
		e.logf("Bento: %s (%s)", e.cfg.bento, e.bentoVersion)
	}

	var prof *profiler
	if e.cfg.profile != "" {
		if prof, err = newProfiler(e.cfg.profile); err != nil {
			return err
		}
	}
	quiet, values, notes := 2*time.Second, map[[2]string][]float64{}, map[[2]string]string{}
	cpu := map[[2]string][]float64{} // µs of the consumer's CPU per message in
	leaks := map[[2]string][]int{}   // keys a leaky consumer emitted twice, per run
	if e.cfg.quick {
		quiet = 300 * time.Millisecond
	}
	counts := map[string]string{}
	for run := range e.cfg.runs {
		for ri, ratio := range e.cfg.ratios {
			group := ratioLabel(ratio)
			wl := workload{events: e.cfg.events, dupRatio: ratio, redeliverRatio: e.cfg.redeliver, payload: 100,
				spread: 2000, seed: uint64(1000*run + ri + 1), keyPrefix: fmt.Sprintf("r%d-%s", run, strings.Fields(group)[0])}
			total, copies, _ := countsOf(wl)
			timeout := time.Minute + time.Duration(total/300)*time.Second
			for _, en := range cs {
				if !en.allDups && ratio != 0.3 {
					continue
				}
				dir, err := os.MkdirTemp(e.tmp, "run-")
				if err != nil {
					return fmt.Errorf("make run folder: %w", err)
				}
				redisCPU := e.redisCPU()
				var watch func(*child) (func(), error)
				profData := ""
				if prof != nil && ratio == 0.3 && !strings.HasPrefix(en.c.name, "Bento") {
					profData = prof.file(en.c.name, run)
					watch = func(ch *child) (func(), error) { return prof.attach(ch, profData) }
				}
				s, err := measurePipeline(ctx, en.c, 1, wl, dir, timeout, quiet, watch)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err != nil {
					e.fail(fmt.Errorf("run %d, %s: %w", run+1, group, err))
					continue
				}
				k := [2]string{group, en.c.name}
				if profData != "" {
					prof.record(en.c.name, profData, float64(s.cpuPerMsg.Nanoseconds())/1e3)
				}
				if server, ok := redisServerRow[en.c.name]; ok && redisCPU != nil {
					if d, err := redisCPU(); err == nil {
						rk := [2]string{group, server}
						cpu[rk] = append(cpu[rk], float64(d.Nanoseconds())/1e3/float64(s.messagesIn))
					} else {
						e.logf("redis-server CPU not read: %v", err)
					}
				}
				if en.c.leaky {
					leaks[k] = append(leaks[k], s.leaked)
				}
				values[k] = append(values[k], s.rate)
				if s.cpuPerMsg > 0 {
					cpu[k] = append(cpu[k], float64(s.cpuPerMsg.Nanoseconds())/1e3)
				}
				notes[k] = cpuNote(cpu[k])
				if en.c.leaky {
					notes[k] += fmt.Sprintf("; keys emitted twice (counted, not failed: not crash-safe by design): %v", leaks[k])
				}
				if s.stats != "" {
					notes[k] += "; last run's own counters: " + s.stats
				}
				counts[group] = fmt.Sprintf("%s events, %s msgs (%s copies) + ~%s redeliveries",
					inum(wl.events), inum(total), inum(copies), inum(s.injected))
				e.logf("run %d %-11s %-34s %s msg/s in %v (%d in, %d injected redeliveries), %.1f µs CPU/msg %s",
					run+1, group, en.c.name, num(s.rate), s.elapsed.Round(time.Millisecond), s.messagesIn, s.injected,
					float64(s.cpuPerMsg.Nanoseconds())/1e3, s.stats)
			}
			dir, err := os.MkdirTemp(e.tmp, "nats-")
			if err != nil {
				return fmt.Errorf("make run folder: %w", err)
			}
			s, err := measureNATS(ctx, wl, dir, timeout)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				e.fail(fmt.Errorf("run %d, %s: %w", run+1, group, err))
				continue
			}
			k := [2]string{group, nameNATS}
			values[k] = append(values[k], s.rate)
			e.logf("run %d %-11s %-34s %s msg/s in %v", run+1, group, nameNATS, num(s.rate), s.elapsed.Round(time.Millisecond))
		}
	}
	for _, ratio := range e.cfg.ratios {
		group := ratioLabel(ratio)
		for _, name := range []string{nameFloor, nameFloorClient, nameFloorBatch, nameMem, nameMemClient, nameDisk, nameDiskClient, nameRedis, nameRedisClient,
			nameBento, nameBentoBatched, nameNATS} {
			v := values[[2]string{group, name}]
			if len(v) == 0 {
				continue
			}
			r := row{section: "pipeline", group: group, name: name, ours: strings.HasPrefix(name, "dedupflow"),
				count: counts[group], unit: "msg/s in", values: v, note: notes[[2]string{group, name}]}
			switch {
			case name == nameNATS:
				r.count = strings.Split(counts[group], " +")[0] + ", published (no redeliveries on the publish side)"
				r.peer = nameMem
			case name == nameFloor || name == nameFloorClient || name == nameFloorBatch:
				r.peer = nameMem
			case clientOf[name] != "":
				r.peer = clientOf[name]
			case r.ours:
				r.peer = nameBento
			default:
				r.peer = nameMem
			}
			e.add(r)
		}
		e.addCPURows(group, counts[group], cpu)
	}
	if prof != nil {
		path, err := prof.summarize(ctx)
		if err != nil {
			return err
		}
		e.logf("profiles and their summary: %s", path)
	}
	return e.benchUnusable(ctx, bin, quiet)
}

// countsOf is the size of a workload without keeping its plan.
func countsOf(w workload) (total, copies, redeliver int) { return counts(w.plan()) }

// bentoVersion is the first line of `bento --version`, for the report.
func bentoVersion(ctx context.Context, bin string) string {
	out, err := exec.CommandContext(ctx, bin, "--version").Output()
	if err != nil {
		return "version unknown: " + err.Error()
	}
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// cpuNote states the consumer's median CPU time per message in.
func cpuNote(us []float64) string {
	if len(us) == 0 {
		return "CPU per message not measured"
	}
	r := row{values: us}
	return fmt.Sprintf("its own CPU: %.1f µs per message in (median)", r.median())
}
