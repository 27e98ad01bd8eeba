package broker

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// BenchmarkSchemaPublish measures publishing to a topic with an Avro
// schema, in each encoding, beside a topic without one: raw publish
// requests of 1000 messages (about 90 bytes of Avro JSON, 30 of binary),
// 8 in flight, to our broker in memory.
//
//	go test -run '^$' -bench SchemaPublish -benchtime 1x ./broker
func BenchmarkSchemaPublish(b *testing.B) {
	n := envInt("BROKER_BENCH_N", 200_000)
	order := map[string]any{"id": "o-1", "qty": 3, "note": map[string]any{"string": "fragile"}, "kind": "BULK", "tags": []any{"a", "b"}}
	jsonData := []byte(`{"id":"o-1","qty":3,"note":{"string":"fragile"},"kind":"BULK","tags":["a","b"]}`)
	for _, tc := range []struct {
		name string
		enc  pb.Encoding
		data []byte
	}{
		{"no-schema", pb.Encoding_ENCODING_UNSPECIFIED, jsonData},
		{"avro-json", pb.Encoding_JSON, jsonData},
		{"avro-binary", pb.Encoding_BINARY, avroBinary(b, orderAvro, order)},
	} {
		b.Run(tc.name, func(b *testing.B) {
			tg := startOurs(b, Options{Now: time.Now})
			c, sc := newClient(b, tg.addr), schemaClient(b, tg.addr)
			ctx := context.Background()
			tp := &pb.Topic{Name: topicName(unique("bench"))}
			if tc.enc != pb.Encoding_ENCODING_UNSPECIFIED {
				sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: unique("order"),
					Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
				if err != nil {
					b.Fatal(err)
				}
				tp.SchemaSettings = &pb.SchemaSettings{Schema: sch.Name, Encoding: tc.enc}
			}
			topic, err := c.TopicAdminClient.CreateTopic(ctx, tp)
			if err != nil {
				b.Fatal(err)
			}
			createSub(b, c, &pb.Subscription{Topic: topic.Name, AckDeadlineSeconds: 60})
			const batch, inflight = 1000, 8
			msgs := make([]*pb.PubsubMessage, batch)
			for i := range msgs {
				msgs[i] = &pb.PubsubMessage{Data: tc.data, Attributes: map[string]string{"id": strconv.Itoa(i)}}
			}
			for range b.N {
				start := time.Now()
				var next atomic.Int64
				var wg sync.WaitGroup
				for range inflight {
					wg.Go(func() {
						for next.Add(batch) <= int64(n) {
							if _, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topic.Name, Messages: msgs}); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				wg.Wait()
				b.ReportMetric(float64(n/batch*batch)/time.Since(start).Seconds(), "pub-msg/s")
			}
		})
	}
}
