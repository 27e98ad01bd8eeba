package pipeline_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/store/mem"
)

// dedupflow_dependency_up names the dependency that took readiness away:
// the sink goes to 0 on a failed write and back to 1 on the next good one,
// while the store stays 1; without a dead-letter topic there is no
// dead_letter series.
func TestDependencyUpGauge(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	reg := prometheus.NewRegistry()
	var clock atomic.Int64 // the pipeline's clock, moved on by the holds it asks for
	clock.Store(time.Now().UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}, pipeline.Deps{
		Store: mem.New(), Logger: testenv.Logger(), Registerer: reg, Now: now,
		Sink: sinkFunc(func(context.Context, *sink.Message) error {
			if failing.Load() {
				return errors.New("injected: sink down")
			}
			return nil
		})})
	if err != nil {
		t.Fatal(err)
	}
	up := func(dep string) float64 { return metricValue(t, reg, `dedupflow_dependency_up{dependency="`+dep+`"}`) }
	if up("store") != 1 || up("sink") != 1 {
		t.Fatalf("before any message: store %v, sink %v; want both up", up("store"), up("sink"))
	}
	msg := func(id string) *pubsub.Message {
		return &pubsub.Message{ID: id, Attributes: map[string]string{"key": id}, Data: []byte(id), PublishTime: time.Now()}
	}
	r := p.Handle(t.Context(), msg("m1"))
	if r.Outcome.Acked() || r.NackAfter <= 0 {
		t.Fatalf("a message whose write failed: %+v, want nacked after the sink's pause", r)
	}
	if up("sink") != 0 || up("store") != 1 || p.Ready() {
		t.Fatalf("after a failed write: sink %v, store %v, ready %v; want 0, 1, false", up("sink"), up("store"), p.Ready())
	}
	if r := p.Handle(t.Context(), msg("m2")); r.Outcome.Acked() || r.NackAfter <= 0 {
		t.Fatalf("a message during the sink's pause: %+v, want held and nacked, not written", r)
	}
	failing.Store(false)
	clock.Add(int64(r.NackAfter)) // the receiver held m1 that long
	if !p.Handle(t.Context(), msg("m2")).Outcome.Acked() {
		t.Fatal("a message written after the sink recovered was not acked")
	}
	if up("sink") != 1 || !p.Ready() {
		t.Fatalf("after a good write: sink %v, ready %v; want 1, true", up("sink"), p.Ready())
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetValue() == "dead_letter" {
					t.Errorf("%s{dependency=dead_letter} exported without a dead-letter topic", mf.GetName())
				}
			}
		}
	}
}
