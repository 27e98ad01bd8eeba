package deploy

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// BenchmarkDrain measures how long a loaded `dedupflow pipeline` with the
// Redis store takes from SIGTERM to exit (what terminationGracePeriodSeconds
// in deploy/kubernetes must exceed), and its peak memory and CPU per message
// on the way (what the resource requests are sized from). Each run starts a
// broker with a backlog of 100,000 messages (30% republished copies), lets
// the pipeline work through a fifth of it, and stops it.
//
//	go test -run '^$' -bench Drain -benchtime 5x ./deploy/
func BenchmarkDrain(b *testing.B) {
	redisURL := testenv.RedisURL(b)
	newCmd := dedupflow(b)
	const events, copies = 77_000, 23_000 // 100,000 messages
	var drain, rss, cpu, settledAt []float64
	for i := range b.N {
		b.StopTimer()
		tp := newTopology(b)
		backlog(b, tp.c, tp.in, fmt.Sprintf("drain-%d-%d", time.Now().UnixNano(), i), events, copies)
		p := startPipeline(b, newCmd, tp, nil, "--id-attribute", "event_id", "--state", redisURL)
		for deadline := time.Now().Add(2 * time.Minute); value(p.scrape(b), "dedupflow_received_total", nil) < (events+copies)/5; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(deadline) {
				fatalf(b, p, "the pipeline did not reach a fifth of the backlog in 2 minutes")
			}
		}
		peak := peakRSS(b, p.cmd.Process.Pid)
		received := value(p.scrape(b), "dedupflow_received_total", nil)
		b.StartTimer()
		start := time.Now()
		if err := p.stop(b); err != nil {
			fatalf(b, p, "exit after SIGTERM: %v", err)
		}
		drain = append(drain, time.Since(start).Seconds())
		b.StopTimer()
		u := p.cmd.ProcessState.SysUsage().(*syscall.Rusage)
		cpuSec := float64(u.Utime.Nano()+u.Stime.Nano()) / 1e9
		rss = append(rss, peak)
		cpu = append(cpu, cpuSec/received*1e6)
		settledAt = append(settledAt, received)
	}
	b.ReportMetric(median(drain), "s-drain")
	b.ReportMetric(slices.Max(drain), "s-drain-max")
	b.ReportMetric(median(rss), "MiB-rss")
	b.ReportMetric(median(cpu), "µs-cpu/msg")
	b.ReportMetric(0, "ns/op")
	b.Logf("drains %.2f s; peak RSS %.0f MiB; CPU %.1f µs per message received; stopped after %.0f received", drain, rss, cpu, settledAt)
}

// backlog publishes events messages with distinct keys and copies more that
// repeat earlier keys (republishes), in batches, before the pipeline starts.
func backlog(b testing.TB, c *pubsub.Client, topic interface{ String() string }, prefix string, events, copies int) {
	b.Helper()
	pub := c.Publisher(topic.String())
	defer pub.Stop()
	pub.PublishSettings.CountThreshold = 1000
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	payload := []byte(strings.Repeat("x", 100))
	for n := range events + copies {
		key := n
		if n >= events {
			key = (n - events) * 3 % events
		}
		r := pub.Publish(context.Background(), &pubsub.Message{Data: payload, Attributes: map[string]string{"event_id": prefix + "-" + strconv.Itoa(key)}})
		wg.Go(func() {
			if _, err := r.Get(context.Background()); err != nil {
				select {
				case errs <- err:
				default:
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		b.Fatalf("publish the backlog: %v", err)
	default:
	}
}

// peakRSS is a process's peak resident memory (VmHWM) in MiB.
func peakRSS(b testing.TB, pid int) float64 {
	b.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kb / 1024
		}
	}
	b.Fatal("no VmHWM in /proc/PID/status")
	return 0
}

func median(xs []float64) float64 {
	s := append([]float64{}, xs...)
	slices.Sort(s)
	return s[len(s)/2]
}
