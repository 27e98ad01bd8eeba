package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// attrSent carries the moment a latency run's message was handed to the
// publisher, in Unix nanoseconds: the bench and the consumer share a clock.
const attrSent = "sent_ns"

// nameMemWait is the batch path that waits up to 5 ms for a batch to fill.
const nameMemWait = "dedupflow pipeline (mem store, --batch-wait 5ms)"

// latencyQuantiles are the percentiles each latency run reports.
var latencyQuantiles = []struct {
	label string
	q     float64
}{{"p50", 0.5}, {"p99", 0.99}, {"p99.9", 0.999}}

// benchLatency measures publish-to-output latency at steady rates well
// below every contender's capacity, where a batching reader could only
// lose: each message is timed from the bench's Publish call to its arrival
// on the output subscription.
func (e *env) benchLatency(ctx context.Context) error {
	bin, floorBin, err := e.buildContenders(ctx)
	if err != nil {
		return err
	}
	cs := []consumer{relayFloorConsumer(floorBin, nameFloor, "client", "batched"),
		named(dedupflowConsumer(bin, "mem store", memState), nameMem),
		named(dedupflowConsumer(bin, "mem store client", memState, client...), nameMemClient),
		named(dedupflowConsumer(bin, "mem store wait", memState, "--batch-wait", "5ms"), nameMemWait)}
	if !e.cfg.quick {
		cs = append(cs, named(dedupflowConsumer(bin, "disk store", diskState), nameDisk),
			named(dedupflowConsumer(bin, "disk store client", diskState, client...), nameDiskClient))
	}
	type load struct{ rate, n int }
	loads := []load{{1000, 5000}, {10_000, 30_000}}
	if e.cfg.quick {
		loads = []load{{500, 500}}
	}
	values := map[[2]string][]float64{} // {group, name}: ms per run
	for run := range e.cfg.runs {
		for _, l := range loads {
			for _, c := range cs {
				dir, err := os.MkdirTemp(e.tmp, "latency-")
				if err != nil {
					return fmt.Errorf("make run folder: %w", err)
				}
				s, err := measureLatency(ctx, c, l.rate, l.n, fmt.Sprintf("l%d-%d", run, l.rate), dir)
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if err != nil {
					e.fail(fmt.Errorf("latency run %d at %d msg/s, %s: %w", run+1, l.rate, c.name, err))
					continue
				}
				var line []string
				for _, q := range latencyQuantiles {
					v := percentile(s.lats, q.q)
					k := [2]string{latencyGroup(l.rate, q.label), c.name}
					values[k] = append(values[k], float64(v.Microseconds())/1e3)
					line = append(line, fmt.Sprintf("%s %v", q.label, v.Round(10*time.Microsecond)))
				}
				k := [2]string{latencyGroup(l.rate, "CPU"), c.name}
				values[k] = append(values[k], float64(s.cpu.Nanoseconds())/1e3)
				line = append(line, fmt.Sprintf("%.1f µs CPU/msg", float64(s.cpu.Nanoseconds())/1e3))
				e.logf("run %d latency at %s msg/s %-52s %s", run+1, inum(l.rate), c.name, strings.Join(line, ", "))
			}
		}
	}
	for _, l := range loads {
		for _, label := range []string{"p50", "p99", "p99.9", "CPU"} {
			unit := "ms"
			if label == "CPU" {
				unit = "µs CPU/msg"
			}
			g := latencyGroup(l.rate, label)
			for _, c := range cs {
				v := values[[2]string{g, c.name}]
				if len(v) == 0 {
					continue
				}
				r := row{section: "latency", group: g, name: c.name, ours: strings.HasPrefix(c.name, "dedupflow"),
					count: fmt.Sprintf("%s messages at %s msg/s, 100 B, no copies", inum(l.n), inum(l.rate)), unit: unit, values: v}
				if c.name != nameFloor {
					r.peer = nameFloor
				}
				e.add(r)
			}
		}
	}
	return nil
}

func latencyGroup(rate int, quantile string) string {
	return fmt.Sprintf("%s msg/s, %s", inum(rate), quantile)
}

// percentile is the q-quantile of lats (nearest rank); lats is sorted.
func percentile(lats []time.Duration, q float64) time.Duration {
	i := int(math.Ceil(q*float64(len(lats)))) - 1
	return lats[max(0, min(i, len(lats)-1))]
}

// latencySample is one latency run: each message's publish-to-output
// latency, sorted, and the consumer's CPU per message over the paced part.
type latencySample struct {
	lats []time.Duration
	cpu  time.Duration
}

// measureLatency starts c on a fresh broker, waits until it passes a
// message through, then publishes n messages of distinct keys at rate per
// second and measures each one's publish-to-output latency.
func measureLatency(ctx context.Context, c consumer, rate, n int, prefix, dir string) (latencySample, error) {
	run, err := openRun(ctx, dir)
	if err != nil {
		return latencySample{}, err
	}
	defer run.close()

	var mu sync.Mutex
	lats := make([]time.Duration, 0, n)
	seen := make(map[string]bool, n)
	warm := make(chan struct{}, 1)
	rctx, stopRecv := context.WithCancel(ctx)
	defer stopRecv()
	recvDone := make(chan error, 1)
	sub := run.client.Subscriber(run.outSub.String())
	sub.ReceiveSettings.NumGoroutines = 2
	go func() {
		recvDone <- sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			now := time.Now()
			m.Ack()
			k := m.Attributes[attrKey]
			if strings.HasPrefix(k, "warm-") {
				select {
				case warm <- struct{}{}:
				default:
				}
				return
			}
			sent, err := strconv.ParseInt(m.Attributes[attrSent], 10, 64)
			mu.Lock()
			defer mu.Unlock()
			if err == nil && !seen[k] {
				seen[k] = true
				lats = append(lats, now.Sub(time.Unix(0, sent)))
			}
		})
	}()
	stopCollector := func() error {
		stopRecv()
		if err := <-recvDone; err != nil && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("receive outputs: %w", err)
		}
		return nil
	}

	run.env.replica = 0
	ch, err := c.start(ctx, run.env)
	if err != nil {
		return latencySample{}, errors.Join(err, stopCollector())
	}
	defer ch.kill()
	pub := run.client.Publisher(run.in.String())
	defer pub.Stop()
	// Small batches, sent at once: the publisher's own batching would
	// otherwise add its 10 ms to every contender alike and hide the rest.
	pub.PublishSettings.DelayThreshold = time.Millisecond
	pub.PublishSettings.CountThreshold = 100
	data := []byte(strings.Repeat("x", 100))
	publish := func(key string) *pubsub.PublishResult {
		return pub.Publish(ctx, &pubsub.Message{Data: data,
			Attributes: map[string]string{attrKey: key, attrSent: strconv.FormatInt(time.Now().UnixNano(), 10)}})
	}

	// Warm up: until the consumer passes a message through, it may still
	// be starting.
	deadline := time.Now().Add(time.Minute)
	for i := 0; ; i++ {
		publish(fmt.Sprintf("warm-%s-%d", prefix, i))
		select {
		case <-warm:
		case <-time.After(100 * time.Millisecond):
			if done, werr := ch.exited(); done {
				return latencySample{}, errors.Join(fmt.Errorf("%s exited while starting: %v (log: %s)", c.name, werr, ch.tail()), stopCollector())
			}
			if time.Now().After(deadline) {
				return latencySample{}, errors.Join(fmt.Errorf("%s passed no message through within a minute", c.name), stopCollector())
			}
			continue
		case <-ctx.Done():
			return latencySample{}, errors.Join(ctx.Err(), stopCollector())
		}
		break
	}

	cpuBefore, err := testenv.ProcessCPU(ch.cmd.Process.Pid)
	if err != nil {
		return latencySample{}, errors.Join(err, stopCollector())
	}
	start, interval := time.Now(), time.Second/time.Duration(rate)
	results := make([]*pubsub.PublishResult, 0, n)
	for i := range n {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d)
		}
		results = append(results, publish(prefix+"-"+strconv.Itoa(i)))
	}
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return latencySample{}, errors.Join(fmt.Errorf("publish message %d: %w", i, err), stopCollector())
		}
	}
	deadline = time.Now().Add(time.Minute)
	for {
		mu.Lock()
		got := len(lats)
		mu.Unlock()
		if got >= n {
			break
		}
		if time.Now().After(deadline) {
			return latencySample{}, errors.Join(&correctnessError{fmt.Sprintf("%s: %d of %d messages in the output a minute after the last publish",
				c.name, got, n)}, stopCollector())
		}
		select {
		case <-ctx.Done():
			return latencySample{}, errors.Join(ctx.Err(), stopCollector())
		case <-time.After(20 * time.Millisecond):
		}
	}
	cpuAfter, err := testenv.ProcessCPU(ch.cmd.Process.Pid)
	if err != nil {
		return latencySample{}, errors.Join(err, stopCollector())
	}
	if err := errors.Join(ch.stop(20*time.Second), stopCollector()); err != nil {
		return latencySample{}, err
	}
	slices.Sort(lats)
	return latencySample{lats: lats, cpu: (cpuAfter - cpuBefore) / time.Duration(n)}, nil
}
