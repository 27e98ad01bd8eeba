package broker

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// BenchmarkReopen measures what a restart costs with a backlog: it queues
// BROKER_BENCH_REOPEN_N (default 1000000) messages of 100 bytes and one
// attribute on a subscription of a durable broker, closes it, and times
// New on the same data directory, which loads the backlog. Profile it with
//
//	go test -run '^$' -bench Reopen -benchtime 3x -cpuprofile cpu.out ./broker
func BenchmarkReopen(b *testing.B) {
	n := envInt("BROKER_BENCH_REOPEN_N", 1_000_000)
	dir := b.TempDir()
	opts := Options{DataDir: dir, NoSync: true, Now: time.Now, Logger: slog.New(slog.DiscardHandler)}
	br, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	topic, sub := topicName(unique("t")), subName(unique("s"))
	if _, err := br.pub.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		b.Fatal(err)
	}
	if _, err := br.sub.CreateSubscription(ctx, &pb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		b.Fatal(err)
	}
	data := make([]byte, 100)
	for i := 0; i < n; i += 1000 {
		req := &pb.PublishRequest{Topic: topic}
		for j := i; j < min(n, i+1000); j++ {
			req.Messages = append(req.Messages, &pb.PubsubMessage{Data: data, Attributes: map[string]string{"id": strconv.Itoa(j)}})
		}
		if _, err := br.pub.Publish(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
	if err := br.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		br, err := New(opts)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		br.mu.Lock()
		held := br.subs[sub].held
		br.mu.Unlock()
		if held != n {
			b.Fatalf("%d messages held after reopening, want %d", held, n)
		}
		if err := br.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Seconds())/float64(b.N), "s/reopen")
}

// BenchmarkRestart is the restart a user sees: a broker process (see
// buildBrokerd) with BROKER_BENCH_RESTART_N (default 1000000) messages of
// 100 bytes and one attribute queued on a subscription is killed with
// SIGKILL and started again on its data directory, then stopped with
// SIGTERM and started again. For each restart it reports the seconds from
// starting the process until it serves (serve-s) and until a new
// subscriber receives its first message (first-s):
//
//	go test -run '^$' -bench Restart -benchtime 1x ./broker
func BenchmarkRestart(b *testing.B) {
	n := envInt("BROKER_BENCH_RESTART_N", 1_000_000)
	bin := buildBrokerd(b)
	for range b.N {
		dir := b.TempDir()
		cmd, addr := startBrokerd(b, bin, dir)
		c := newClient(b, addr)
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60}).Name
		fill(b, c, topic, n)
		c.Close()
		for _, stop := range []struct {
			name string
			sig  syscall.Signal
		}{{"kill", syscall.SIGKILL}, {"clean", syscall.SIGTERM}} {
			if err := cmd.Process.Signal(stop.sig); err != nil {
				b.Fatal(err)
			}
			cmd.Wait()
			start := time.Now()
			cmd, addr = startBrokerd(b, bin, dir, "--listen", addr)
			serve := time.Since(start)
			c := newClient(b, addr)
			firstMessage(b, c, sub)
			b.ReportMetric(serve.Seconds(), stop.name+"-serve-s")
			b.ReportMetric(time.Since(start).Seconds(), stop.name+"-first-s")
			c.Close()
		}
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	}
}

// fill publishes n messages and waits until all are answered.
func fill(b *testing.B, c *pubsub.Client, topic string, n int) {
	p := c.Publisher(topic)
	p.PublishSettings.NumGoroutines = 16
	p.PublishSettings.CountThreshold = 1000
	p.PublishSettings.FlowControlSettings.MaxOutstandingMessages = 50_000
	p.PublishSettings.FlowControlSettings.LimitExceededBehavior = pubsub.FlowControlBlock
	defer p.Stop()
	ctx := context.Background()
	data := make([]byte, 100)
	results := make(chan *pubsub.PublishResult, 50_000)
	errc := make(chan error, 1)
	go func() {
		var first error
		for r := range results {
			if _, err := r.Get(ctx); err != nil && first == nil {
				first = err
			}
		}
		errc <- first
	}()
	for i := range n {
		results <- p.Publish(ctx, &pubsub.Message{Data: data, Attributes: map[string]string{"id": strconv.Itoa(i)}})
	}
	close(results)
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
}

// firstMessage returns once a new subscriber on sub got a message; it is
// not acknowledged, so the backlog stays.
func firstMessage(b *testing.B, c *pubsub.Client, sub string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var got atomic.Bool
	err := c.Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		got.Store(true)
		m.Nack()
		cancel()
	})
	if err != nil || !got.Load() {
		b.Fatalf("no message after restart: %v", err)
	}
}
