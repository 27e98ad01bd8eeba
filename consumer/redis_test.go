package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/store/redis"
)

// Two replicas — each its own client, subscriber, Redis store instance and
// Dedup, as two processes would have — share one subscription and one
// Redis. Every key is published three times at once, so copies of a key
// reach both replicas together, and some handlers fail their first call.
// The handler must succeed exactly once per key, never run twice at once
// for a key, and every copy must end up acked.
func TestTwoConsumersShareRedis(t *testing.T) {
	url := testenv.RedisURL(t)
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			e := newEnv(t, kind)
			prefix := fmt.Sprintf("dedupflow-consumer-test:%d:", time.Now().UnixNano())
			c := newCalls()
			var replicas []*consumer.Dedup
			for range 2 {
				st, err := redis.Open(context.Background(), url, redis.Options{Prefix: prefix, Logger: testenv.Logger()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { st.Close() })
				d := mustNew(t, st, consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}}, func(_ context.Context, m *pubsub.Message) error {
					key := m.Attributes["event_id"]
					n, done := c.enter(key)
					time.Sleep(5 * time.Millisecond) // long enough for copies to meet
					i, _ := strconv.Atoi(key[len("order-"):])
					if i%4 == 0 && n == 1 {
						err := errors.New("first attempt fails")
						done(err)
						return err
					}
					done(nil)
					return nil
				})
				replicas = append(replicas, d)
				e.receive(e.client(), d.Handle)
			}

			const keys, copies = 20, 3
			var results []*pubsub.PublishResult
			for i := range keys {
				for j := range copies {
					results = append(results, e.pub.Publish(context.Background(), &pubsub.Message{
						Data:       []byte(fmt.Sprintf("copy %d", j)),
						Attributes: map[string]string{"event_id": fmt.Sprintf("order-%d", i)},
					}))
				}
			}
			ids := map[string]bool{}
			for _, r := range results {
				id, err := r.Get(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				ids[id] = true
			}
			if len(ids) != keys*copies {
				t.Fatalf("%d distinct message IDs, want %d", len(ids), keys*copies)
			}

			// Every copy is acked once: handled or dropped as a duplicate.
			settled := func() (n int64, per []consumer.Counts) {
				for _, d := range replicas {
					cn := d.Counts()
					n += cn.Emitted + cn.DuplicateRepublish + cn.DuplicateRedelivery
					per = append(per, cn)
				}
				return n, per
			}
			eventually(t, "every copy settled", func() bool { n, _ := settled(); return n >= keys*copies })
			time.Sleep(300 * time.Millisecond)
			for i := range keys {
				key := fmt.Sprintf("order-%d", i)
				want := 1 // a key whose handler succeeds runs exactly once
				if i%4 == 0 {
					want = 2 // its failed first call, then one success
				}
				if n, ok := c.get(key); n != want || ok != 1 {
					t.Errorf("%s: handler ran %d times, %d successful; want %d and 1", key, n, ok, want)
				}
			}
			c.mu.Lock()
			if len(c.overlap) > 0 {
				t.Errorf("handler ran twice at once for %v", c.overlap)
			}
			c.mu.Unlock()
			n, per := settled()
			if n != keys*copies {
				t.Errorf("%d acked, want %d", n, keys*copies)
			}
			if per[0].Emitted == 0 || per[1].Emitted == 0 {
				t.Logf("one replica handled nothing (counts %+v); the test still holds, but shared less", per)
			}
			t.Logf("replica counts: %+v", per)
		})
	}
}
