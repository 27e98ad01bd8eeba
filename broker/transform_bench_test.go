package broker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// udfBench is the small UDF of the transform benchmarks: it upper-cases
// the data and adds an attribute.
var udfBench = []*pb.MessageTransform{jsTransform("up", udfUpper)}

// BenchmarkTransform measures, in one run, publishing to a topic with a
// small UDF beside one without (raw publish requests of 1000 messages of
// about 80 bytes, 8 in flight) and delivering through a subscription with
// the UDF beside one without (the official client's streaming pull, acking
// each message), to our broker in memory.
//
//	go test -run '^$' -bench Transform -benchtime 1x ./broker
func BenchmarkTransform(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 100_000)
	data := []byte(`{"id":"o-1","qty":3,"note":"fragile","kind":"BULK","tags":["a","b"],"pad":"xxxxxxxx"}`)
	const batch, inflight = 1000, 8
	msgs := make([]*pb.PubsubMessage, batch)
	for i := range msgs {
		msgs[i] = &pb.PubsubMessage{Data: data, Attributes: map[string]string{"id": strconv.Itoa(i)}}
	}
	publishAll := func(b *testing.B, c *pubsub.Client, topic string) float64 {
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range inflight {
			wg.Go(func() {
				for next.Add(batch) <= int64(n) {
					if _, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic, Messages: msgs}); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return float64(n/batch*batch) / time.Since(start).Seconds()
	}
	for _, side := range []string{"publish", "delivery"} {
		for _, udf := range []bool{false, true} {
			name := side + "/none"
			if udf {
				name = side + "/udf"
			}
			b.Run(name, func(b *testing.B) {
				tg := startOurs(b, Options{Now: time.Now})
				c := newClient(b, tg.addr)
				tp := &pb.Topic{Name: topicName(unique("bench"))}
				sp := &pb.Subscription{AckDeadlineSeconds: 60}
				if udf && side == "publish" {
					tp.MessageTransforms = udfBench
				}
				if udf && side == "delivery" {
					sp.MessageTransforms = udfBench
				}
				topic, err := c.TopicAdminClient.CreateTopic(context.Background(), tp)
				if err != nil {
					b.Fatal(err)
				}
				sp.Topic = topic.Name
				sub := createSub(b, c, sp)
				for range b.N {
					if side == "publish" {
						b.ReportMetric(publishAll(b, c, topic.Name), "pub-msg/s")
						continue
					}
					want := int64(n / batch * batch)
					publishAll(b, c, topic.Name)
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					var got atomic.Int64
					start := time.Now()
					s := c.Subscriber(sub.Name)
					s.ReceiveSettings.MaxOutstandingMessages = 10_000
					err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
						if udf && m.Attributes["transformed"] != "yes" {
							b.Error("a message not transformed")
						}
						m.Ack()
						if got.Add(1) == want {
							cancel()
						}
					})
					cancel()
					if err != nil || got.Load() < want {
						b.Fatalf("received %d of %d: %v", got.Load(), want, err)
					}
					b.ReportMetric(float64(want)/time.Since(start).Seconds(), "recv-msg/s")
				}
			})
		}
	}
}
