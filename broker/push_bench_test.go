package broker

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// BenchmarkPush publishes n messages to a push subscription whose endpoint,
// a local HTTP server, acks each at once, and measures how fast they are
// pushed, against ours and the official emulator. Run it once:
//
//	go test -run '^$' -bench Push -benchtime 1x ./broker
//
// Counts: BROKER_BENCH_PUSH_N (ours, default 20000),
// BROKER_BENCH_EMULATOR_PUSH_N (default 2000).
func BenchmarkPush(b *testing.B) {
	b.Run("ours", func(b *testing.B) {
		pushBench(b, startOurs(b, Options{Now: time.Now}), envInt("BROKER_BENCH_PUSH_N", 20_000))
	})
	b.Run("emulator", func(b *testing.B) {
		pushBench(b, emulator(b), envInt("BROKER_BENCH_EMULATOR_PUSH_N", 2_000))
	})
}

func pushBench(b *testing.B, tg target, n int) {
	for range b.N {
		var got atomic.Int64
		done := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if got.Add(1) == int64(n) {
				close(done)
			}
			w.WriteHeader(http.StatusNoContent)
		}))
		c := newClient(b, tg.addr)
		topic := createTopic(b, c)
		sub := createSub(b, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, PushConfig: &pb.PushConfig{PushEndpoint: srv.URL}})
		b.StartTimer()
		start := time.Now()
		for i := 0; i < n; i += 1000 {
			var msgs []*pb.PubsubMessage
			for j := i; j < min(i+1000, n); j++ {
				msgs = append(msgs, &pb.PubsubMessage{Data: fmt.Appendf(nil, "message %d", j), Attributes: map[string]string{"k": "v"}})
			}
			if _, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic, Messages: msgs}); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(10 * time.Minute):
			b.Fatalf("%d of %d messages pushed", got.Load(), n)
		}
		b.StopTimer()
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "push-msg/s")
		c.SubscriptionAdminClient.DeleteSubscription(context.Background(), &pb.DeleteSubscriptionRequest{Subscription: sub.Name})
		srv.Close()
	}
}
