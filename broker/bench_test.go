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
// our broker (in memory, on disk with fsync, on disk without fsync, in
// memory with a filter that passes half of the messages), pstest and the
// official emulator, with the same client settings. Run it once:
//
//	go test -run '^$' -bench EndToEnd -benchtime 1x ./broker
//
// Counts: BROKER_BENCH_N (ours, default 200000), BROKER_BENCH_EMULATOR_N
// (default 50000), BROKER_BENCH_PSTEST_N (default 5000).
func BenchmarkEndToEnd(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 200_000)
	b.Run("ours-memory", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now})
		endToEnd(b, tg, n, "")
	})
	b.Run("ours-filter-half", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now})
		endToEnd(b, tg, n, `attributes.source = "bench"`)
	})
	b.Run("ours-disk-fsync", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now, DataDir: b.TempDir()})
		endToEnd(b, tg, n, "")
	})
	b.Run("ours-disk-nosync", func(b *testing.B) {
		tg := startOurs(b, Options{Now: time.Now, DataDir: b.TempDir(), NoSync: true})
		endToEnd(b, tg, n, "")
	})
	b.Run("pstest", func(b *testing.B) {
		endToEnd(b, startPstest(b), envInt("BROKER_BENCH_PSTEST_N", 5_000), "")
	})
	b.Run("emulator", func(b *testing.B) {
		endToEnd(b, emulator(b), envInt("BROKER_BENCH_EMULATOR_N", 50_000), "")
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

// endToEnd publishes n messages whose "source" attribute alternates between
// "bench" and "other" (same size), so that a filter can pass half of them;
// recv-msg/s counts the messages delivered.
func endToEnd(b *testing.B, tg target, n int, filter string) {
	want := n
	if filter != "" {
		want = (n + 1) / 2
	}
	for range b.N {
		c := newClient(b, tg.addr)
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, Filter: filter})
		ctx := context.Background()
		heap0 := heapInUse()

		// Publish: the client batches (100 messages per request by default)
		// and keeps many requests in flight.
		p := c.Publisher(topic)
		p.PublishSettings.NumGoroutines = 16
		p.PublishSettings.CountThreshold = 1000
		p.PublishSettings.ByteThreshold = 5e6
		p.PublishSettings.FlowControlSettings.MaxOutstandingMessages = 50_000
		data := make([]byte, 100)
		start := time.Now()
		results := make([]*pubsub.PublishResult, 0, n)
		for i := range n {
			source := "bench"
			if i%2 == 1 {
				source = "other"
			}
			results = append(results, p.Publish(ctx, &pubsub.Message{Data: data,
				Attributes: map[string]string{"id": strconv.Itoa(i), "source": source}}))
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
			if _, dup := seen.LoadOrStore(m.ID, true); !dup && got.Add(1) == int64(want) {
				cancel()
			}
		})
		recvDur := time.Since(start)
		cancel()
		if err != nil {
			b.Fatal(err)
		}
		if got.Load() < int64(want) {
			b.Fatalf("received %d of %d", got.Load(), want)
		}
		b.ReportMetric(float64(n)/pubDur.Seconds(), "pub-msg/s")
		b.ReportMetric(float64(want)/recvDur.Seconds(), "recv-msg/s")
		b.ReportMetric(float64(n), "msgs")
		b.Logf("%s: %d messages, publish %v (%.0f msg/s), receive+ack %v (%.0f msg/s)",
			tg.name, n, pubDur.Round(time.Millisecond), float64(n)/pubDur.Seconds(),
			recvDur.Round(time.Millisecond), float64(want)/recvDur.Seconds())
		c.Close()
	}
}

// BenchmarkRawGRPC measures the servers themselves: the same workload as
// BenchmarkEndToEnd, but through the generated gRPC stubs (publish requests
// of 1000 messages, 8 in flight; one StreamingPull stream; acks in unary
// batches of up to 1000 sent concurrently), so that the client library's own
// cost, which dominates BenchmarkEndToEnd on a small machine, is left out.
func BenchmarkRawGRPC(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 200_000)
	b.Run("ours-memory", func(b *testing.B) { rawGRPC(b, startOurs(b, Options{Now: time.Now}), n) })
	b.Run("ours-disk-fsync", func(b *testing.B) {
		rawGRPC(b, startOurs(b, Options{Now: time.Now, DataDir: b.TempDir()}), n)
	})
	b.Run("pstest", func(b *testing.B) { rawGRPC(b, startPstest(b), envInt("BROKER_BENCH_PSTEST_N", 5_000)) })
	b.Run("emulator", func(b *testing.B) { rawGRPC(b, emulator(b), envInt("BROKER_BENCH_EMULATOR_N", 50_000)) })
}

func rawGRPC(b *testing.B, tg target, n int) {
	for range b.N {
		c := newClient(b, tg.addr)
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60})
		ctx := context.Background()
		const batch, inflight = 1000, 8
		msgs := make([]*pb.PubsubMessage, batch)
		for i := range msgs {
			msgs[i] = &pb.PubsubMessage{Data: make([]byte, 100), Attributes: map[string]string{"id": strconv.Itoa(i), "source": "bench"}}
		}
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range inflight {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(batch) <= int64(n) {
					if _, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic, Messages: msgs}); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		pubDur := time.Since(start)
		n = n / batch * batch

		start = time.Now()
		sctx, cancel := context.WithCancel(ctx)
		stream, err := c.SubscriptionAdminClient.StreamingPull(sctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := stream.Send(&pb.StreamingPullRequest{Subscription: sub.Name, StreamAckDeadlineSeconds: 60,
			MaxOutstandingMessages: 50_000}); err != nil {
			b.Fatal(err)
		}
		seen := make(map[string]bool, n)
		var acks sync.WaitGroup
		for len(seen) < n {
			resp, err := stream.Recv()
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]string, 0, len(resp.ReceivedMessages))
			for _, m := range resp.ReceivedMessages {
				seen[m.Message.MessageId] = true
				ids = append(ids, m.AckId)
			}
			if len(ids) > 0 {
				acks.Add(1)
				go func() {
					defer acks.Done()
					if err := c.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub.Name, AckIds: ids}); err != nil {
						b.Error(err)
					}
				}()
			}
		}
		acks.Wait()
		recvDur := time.Since(start)
		cancel()
		b.ReportMetric(float64(n)/pubDur.Seconds(), "pub-msg/s")
		b.ReportMetric(float64(n)/recvDur.Seconds(), "recv-msg/s")
		b.Logf("%s: %d messages, publish %v (%.0f msg/s), receive+ack %v (%.0f msg/s)",
			tg.name, n, pubDur.Round(time.Millisecond), float64(n)/pubDur.Seconds(),
			recvDur.Round(time.Millisecond), float64(n)/recvDur.Seconds())
		c.Close()
	}
}
