package broker

import (
	"context"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// BenchmarkEndToEnd publishes messages with attributes through the official
// Go client, then receives them with streaming pull and acks them, against
// our broker (in memory, on disk with fsync, on disk without fsync), pstest
// and the official emulator, with the same client settings. Run it once:
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x ./broker
//
// Counts: BROKER_BENCH_N (ours, default 200000), BROKER_BENCH_EMULATOR_N
// (default 50000), BROKER_BENCH_PSTEST_N (default 5000).
func BenchmarkEndToEnd(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 200_000)
	b.Run("ours-memory", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now})
		endToEnd(b, tg, n)
	})
	b.Run("ours-disk-fsync", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now, DataDir: b.TempDir()})
		endToEnd(b, tg, n)
	})
	b.Run("ours-disk-nosync", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now, DataDir: b.TempDir(), NoSync: true})
		endToEnd(b, tg, n)
	})
	b.Run("pstest", func(b *testing.B) {
		endToEnd(b, startPstest(b), envInt("BROKER_BENCH_PSTEST_N", 5_000))
	})
	b.Run("emulator", func(b *testing.B) {
		endToEnd(b, emulator(b), envInt("BROKER_BENCH_EMULATOR_N", 50_000))
	})
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

func endToEnd(b *testing.B, tg target, n int) {
	for range b.N {
		c := newClient(b, tg.addr)
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60})
		ctx := context.Background()
		heap0 := heapInUse()

		// Publish: the client batches (100 messages per request by default)
		// and keeps many requests in flight.
		p := c.Publisher(topic)
		p.PublishSettings.NumGoroutines = 16
		data := make([]byte, 100)
		start := time.Now()
		results := make([]*pubsub.PublishResult, 0, n)
		for i := range n {
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: data,
				Attributes: map[string]string{"id": strconv.Itoa(i), "source": "bench"}}))
		}
		for _, r := range results {
			if _, err := r.Get(ctx); err != nil {
				b.Fatal(err)
			}
		}
		pubDur := time.Since(start)
		p.Stop()
		results = nil
		if tg.ours != nil {
			perMsg := float64(heapInUse()-heap0) / float64(n)
			b.ReportMetric(perMsg, "heap-B/queued-msg")
		}

		// Receive and ack everything with streaming pull.
		s := c.Subscriber(sub.Name)
		s.ReceiveSettings.NumGoroutines = 4
		s.ReceiveSettings.MaxOutstandingMessages = 20_000
		var got atomic.Int64
		seen := sync.Map{}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		start = time.Now()
		err := s.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			if _, dup := seen.LoadOrStore(m.ID, true); !dup && got.Add(1) == int64(n) {
				cancel()
			}
		})
		recvDur := time.Since(start)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if got.Load() < int64(n) {
			b.Fatalf("received %d of %d", got.Load(), n)
		}
		b.ReportMetric(float64(n)/pubDur.Seconds(), "pub-msg/s")
		b.ReportMetric(float64(n)/recvDur.Seconds(), "recv-msg/s")
		b.ReportMetric(float64(n), "msgs")
		b.Logf("%s: %d messages, publish %v (%.0f msg/s), receive+ack %v (%.0f msg/s)",
			tg.name, n, pubDur.Round(time.Millisecond), float64(n)/pubDur.Seconds(),
			recvDur.Round(time.Millisecond), float64(n)/recvDur.Seconds())
		c.Close()
	}
}
