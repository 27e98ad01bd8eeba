package pipeline_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/audit/redisaudit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/store/mem"
)

// With the audit kept in Redis, a replica started after another one
// stopped marks the copy of a key the first one emitted.
func TestAuditInRedisAcrossReplicas(t *testing.T) {
	url := testenv.RedisURL(t)
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	prefix := fmt.Sprintf("pipeline-test-%d:", time.Now().UnixNano())
	var outs []*sink.Message
	replica := func() *pipeline.Pipeline {
		to, err := redisaudit.Open(t.Context(), url, redisaudit.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { to.Close() })
		p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", Horizon: time.Minute},
			Audit: audit.Options{Horizon: 7 * 24 * time.Hour, Capacity: 10_000}},
			pipeline.Deps{Store: mem.New(), Logger: testenv.Logger(), Now: clock, AuditTarget: to,
				Sink: sinkFunc(func(_ context.Context, m *sink.Message) error { outs = append(outs, m); return nil })})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	msg := func(id, key string) *pubsub.Message {
		return &pubsub.Message{ID: id, Data: []byte(id), Attributes: map[string]string{"key": key}, PublishTime: now}
	}
	if err := replica().Run(t.Context(), replay{msg("m1", "order-1")}); err != nil {
		t.Fatal(err)
	}
	now = now.Add(3 * time.Hour)
	b := replica()
	if err := b.Run(t.Context(), replay{msg("m2", "order-1"), msg("m3", "order-2")}); err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 || outs[1].Attributes[pipeline.AttrLateDuplicate] != pipeline.LateDuplicateProbable ||
		outs[2].Attributes[pipeline.AttrLateDuplicate] != "" || b.Counts().LateDuplicateSuspected != 1 {
		t.Fatalf("outputs %+v, counts %+v; want m2 marked, m3 not", outs, b.Counts())
	}
}
