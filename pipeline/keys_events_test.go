package pipeline_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/store/mem"
)

// End to end through Pub/Sub: two orders with the same order.id in their
// JSON body collapse; a payload that is not JSON falls back to its message
// ID and is counted as missing its key.
func TestKeyFromJSONBody(t *testing.T) {
	_, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{From: dedup.KeyFromJSON, Path: "order.id"}}})
	r.start()
	r.publish(`{"order":{"id":"A-17","total":3}}`, nil)
	r.waitCounts("first", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	r.publish(`{"order":{"total":3,"id":"A-17"},"retry":1}`, nil)
	r.publish(`not json`, nil)
	c := r.waitCounts("all", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == 3 })
	if c.Emitted != 2 || c.DuplicateRepublish != 1 || c.MissingID != 1 {
		t.Fatalf("counts %+v; want 2 emitted, 1 republish, 1 missing key", c)
	}
	out := r.drain(r.outSub, 2, 300*time.Millisecond)
	if len(out) != 2 || out[0].data != `not json` || out[1].attrs[pipeline.DefaultOutputIDAttribute] != "A-17" {
		t.Fatalf("output %+v; want the first order keyed A-17 and the non-JSON message", out)
	}
}

// The content hash collapses identical payloads, whatever their attributes,
// and the output carries the hex SHA-256 as its key.
func TestKeyFromHash(t *testing.T) {
	_, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{From: dedup.KeyFromHash}}})
	r.start()
	r.publish("same body", map[string]string{"try": "1"})
	r.waitCounts("first", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	r.publish("same body", map[string]string{"try": "2"})
	r.publish("other body", nil)
	c := r.waitCounts("all", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == 3 })
	if c.Emitted != 2 || c.DuplicateRepublish != 1 {
		t.Fatalf("counts %+v; want 2 emitted, 1 republish", c)
	}
	sum := sha256.Sum256([]byte("same body"))
	out := r.drain(r.outSub, 2, 300*time.Millisecond)
	if len(out) != 2 || out[1].data != "same body" || out[1].attrs[pipeline.DefaultOutputIDAttribute] != hex.EncodeToString(sum[:]) {
		t.Fatalf("output %+v; want the first copy keyed by its SHA-256", out)
	}
}

// Event time through Pub/Sub, with the clock injected: horizon 1 min,
// lateness 30 s. Out-of-order copies within the lateness are duplicates;
// a copy more than the horizon behind the watermark is too late and
// follows --late.
func TestEventTimeDomain(t *testing.T) {
	t0 := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	ts := func(s int) map[string]string {
		return map[string]string{"key": "k" + strconv.Itoa(s/1000), "ts": strconv.FormatInt(t0.Add(time.Duration(s%1000)*time.Second).UnixMilli(), 10)}
	}
	for _, late := range []dedup.Late{dedup.LatePass, dedup.LateDeadLetter} {
		t.Run(late.String(), func(t *testing.T) {
			_, conn := newPstest(t)
			clock := func() time.Time { return t0.Add(time.Hour) } // processing time is far ahead: replaying a backlog
			r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "ts", Late: late, Horizon: time.Minute, TimeDomain: dedup.EventTime, AllowedLateness: 30 * time.Second}}, deadLetter: true, now: clock})
			r.start()
			// Key k1 (1000+s) at event second s; k2 and k3 only move the watermark.
			steps := []struct {
				data  string
				code  int
				until func(pipeline.Counts) bool
			}{
				{"a@0", 1000, func(c pipeline.Counts) bool { return c.Emitted == 1 }},
				{"b@80", 2080, func(c pipeline.Counts) bool { return c.Emitted == 2 }}, // watermark 50
				{"a@10 copy", 1010, func(c pipeline.Counts) bool { return c.DuplicateRepublish == 1 }},
				{"a@0 copy", 1000, func(c pipeline.Counts) bool { return c.DuplicateRepublish == 2 }},
				{"c@200", 3200, func(c pipeline.Counts) bool { return c.Emitted == 3 }}, // watermark 170
				// TooLate is counted as the copy is settled, its outcome once
				// the batch ends: wait for both.
				{"a@0 late", 1000, func(c pipeline.Counts) bool {
					return c.TooLate == 1 && c.Emitted+c.DuplicateRepublish+c.DeadLettered == 6
				}},
			}
			for _, s := range steps {
				r.publish(s.data, ts(s.code))
				r.waitCounts(s.data, s.until)
			}
			c := r.p.Counts()
			switch late {
			case dedup.LatePass:
				if c.Emitted != 4 || c.DeadLettered != 0 {
					t.Fatalf("counts %+v; want the late copy emitted", c)
				}
				out := r.drain(r.outSub, 4, 300*time.Millisecond)
				if d := datas(out); !slices.Equal(d, []string{"a@0", "a@0 late", "b@80", "c@200"}) {
					t.Fatalf("output %q", d)
				}
			case dedup.LateDeadLetter:
				if c.Emitted != 3 || c.DeadLettered != 1 {
					t.Fatalf("counts %+v; want the late copy dead-lettered", c)
				}
				dl := r.drain(r.dlSub, 1, 300*time.Millisecond)
				if len(dl) != 1 || dl[0].data != "a@0 late" || !strings.Contains(dl[0].attrs[pipeline.AttrError], "too late") {
					t.Fatalf("dead letters %+v", dl)
				}
			}
			if c.Received != c.Emitted+c.DuplicateRepublish+c.DeadLettered {
				t.Fatalf("outcomes do not add up to received: %+v", c)
			}
		})
	}
}

// End to end: a copy after the exact horizon but inside the audit horizon
// is emitted, marked, and counted; a key never seen is not marked.
func TestAuditMarksLateCopy(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	_, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", Horizon: time.Minute}, Audit: audit.Options{Horizon: 24 * time.Hour, Capacity: 1000}}, now: clock})
	r.start()
	r.publish("first", map[string]string{"key": "k"})
	r.waitCounts("first", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	advance(30 * time.Second)
	r.publish("inside", map[string]string{"key": "k"})
	r.waitCounts("inside", func(c pipeline.Counts) bool { return c.DuplicateRepublish == 1 })
	advance(3 * time.Hour)
	r.publish("hours later", map[string]string{"key": "k"})
	r.publish("new key", map[string]string{"key": "other"})
	c := r.waitCounts("late copy", func(c pipeline.Counts) bool { return c.Emitted == 3 })
	if c.LateDuplicateSuspected != 1 || c.Received != c.Emitted+c.DuplicateRepublish {
		t.Fatalf("counts %+v; want one suspected late duplicate among the emitted", c)
	}
	for _, m := range r.drain(r.outSub, 3, 300*time.Millisecond) {
		marked := m.attrs[pipeline.AttrLateDuplicate] == pipeline.LateDuplicateProbable
		if marked != (m.data == "hours later") {
			t.Errorf("%q marked %v (attributes %v)", m.data, marked, m.attrs)
		}
	}
}

// sinkFunc is a sink in a function.
type sinkFunc func(ctx context.Context, m *sink.Message) error

func (f sinkFunc) Write(ctx context.Context, m *sink.Message) error { return f(ctx, m) }

// replay is a Receiver that hands over fixed messages, then returns.
type replay []*pubsub.Message

func (r replay) Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error {
	for _, m := range r {
		f(ctx, m)
	}
	return nil
}

// The audit survives a restart through its snapshot file, and its gauges
// and counter are exported while the outcomes still add up to received.
func TestAuditFileAcrossRestartAndMetrics(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	path := t.TempDir() + "/state.db.audit"
	var outs []*sink.Message
	newPipeline := func(reg prometheus.Registerer) *pipeline.Pipeline {
		p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", Horizon: time.Minute},
			Audit:     audit.Options{Horizon: 7 * 24 * time.Hour, Capacity: 10_000},
			AuditFile: path},
			pipeline.Deps{Store: mem.New(), Logger: testenv.Logger(), Now: clock, Registerer: reg,
				Sink: sinkFunc(func(_ context.Context, m *sink.Message) error { outs = append(outs, m); return nil })})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	msg := func(id, key string) *pubsub.Message {
		return &pubsub.Message{ID: id, Data: []byte(id), Attributes: map[string]string{"key": key}, PublishTime: now}
	}
	if err := newPipeline(nil).Run(t.Context(), replay{msg("m1", "order-1")}); err != nil {
		t.Fatal(err)
	}
	// A new process, two days later: the exact horizon (in memory) is gone,
	// the audit is not.
	now = now.Add(48 * time.Hour)
	reg := prometheus.NewRegistry()
	p := newPipeline(reg)
	if err := p.Run(t.Context(), replay{msg("m2", "order-1"), msg("m3", "order-2")}); err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3 || outs[1].Attributes[pipeline.AttrLateDuplicate] != pipeline.LateDuplicateProbable ||
		outs[2].Attributes[pipeline.AttrLateDuplicate] != "" {
		t.Fatalf("outputs %+v; want m2 marked, m3 not", outs)
	}
	for name, want := range map[string]float64{
		"dedupflow_late_duplicates_suspected_total":               1,
		"dedupflow_received_total":                                2,
		"dedupflow_audit_keys":                                    3, // order-1 in two generations
		"dedupflow_audit_capacity_keys":                           10_000,
		`dedupflow_messages_total{outcome="emitted"}`:             2,
		"dedupflow_audit_filter_bytes":                            -1, // any positive
		"dedupflow_audit_false_positive_ratio":                    -2, // exported; ~0 at 3 keys
		`dedupflow_messages_total{outcome="retried"}`:             0,
		`dedupflow_messages_total{outcome="duplicate_republish"}`: 0,
	} {
		got := metricValue(t, reg, name)
		if (want >= 0 && got != want) || (want == -1 && got <= 0) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}

// metricValue reads one sample by name and optional {label="value"}.
func metricValue(t *testing.T, reg *prometheus.Registry, sel string) float64 {
	t.Helper()
	name, label, _ := strings.Cut(sel, "{")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" {
				lp := m.GetLabel()
				if len(lp) != 1 || lp[0].GetName()+`="`+lp[0].GetValue()+`"}` != label {
					continue
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	t.Fatalf("metric %s not exported", sel)
	return 0
}

// A keyless message falls back to its message ID in a namespace of its
// own: an event whose key equals that ID is not taken for its copy (nor it
// for the event's), whichever way the key is taken, and the output carries
// the fallback as dedup.MessageIDKey, never as a bare ID a downstream
// reader could mistake for an event's key. On the broker, message IDs
// count up from 1, as small as business keys.
func TestKeylessAndKeyedNeverCollide(t *testing.T) {
	for _, c := range []struct {
		name  string
		rule  dedup.Policy
		keyed func(id string) (string, map[string]string)
	}{
		{"attribute", dedup.Policy{IDAttribute: "event_id"},
			func(id string) (string, map[string]string) { return "event", map[string]string{"event_id": id} }},
		{"json", dedup.Policy{From: dedup.KeyFromJSON, Path: "order_id"},
			func(id string) (string, map[string]string) { return `{"order_id":` + id + `}`, nil }},
	} {
		t.Run(c.name, func(t *testing.T) {
			addr := brokertest.Start(t)
			r := newRig(t, pubsubio.Insecure(addr), rigOpts{cfg: pipeline.Config{Policy: c.rule, OutputIDAttribute: "key"}})
			r.start()
			id := r.publish("keyless", nil)
			data, attrs := c.keyed(id)
			r.publish(data, attrs)
			n := r.waitCounts("both", func(n pipeline.Counts) bool { return n.Emitted+n.DuplicateRepublish == 2 })
			if n.Emitted != 2 {
				t.Fatalf("counts %+v: the event keyed %s was taken for a copy of the keyless message %s", n, id, id)
			}
			keys := map[string]string{}
			for _, m := range r.drain(r.outSub, 2, 200*time.Millisecond) {
				keys[m.data] = m.attrs["key"]
			}
			if keys["keyless"] != dedup.MessageIDKey(id) || keys[data] != id {
				t.Fatalf("output keys %v: want the keyless message under %q and the event under %q", keys, dedup.MessageIDKey(id), id)
			}
		})
	}
}

// refusingSink is a sink whose server refused the credentials.
type refusingSink struct{ writes atomic.Int32 }

func (s *refusingSink) Write(context.Context, *sink.Message) error {
	s.writes.Add(1)
	return fmt.Errorf("password authentication failed: %w", dedup.ErrFatal)
}

// A sink error that retrying cannot fix stops Run with that error (the
// command then exits non-zero); the message is nacked, not acked, and its
// key released, so nothing is lost.
func TestFatalSinkErrorStopsRun(t *testing.T) {
	srv, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "event_id"}}})
	s := &refusingSink{}
	p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "event_id"}}, pipeline.Deps{Store: mem.New(), Sink: s})
	if err != nil {
		t.Fatal(err)
	}
	id := r.publish("x", map[string]string{"event_id": "k"})
	done := make(chan error, 1)
	go func() { done <- p.Run(context.Background(), r.c.Subscriber(r.inSub.String())) }()
	select {
	case err := <-done:
		if !errors.Is(err, dedup.ErrFatal) {
			t.Fatalf("Run returned %v, want the sink's fatal error", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run still running 30 s after a fatal sink error")
	}
	if p.Ready() || s.writes.Load() != 1 || srv.Message(id).Acks != 0 {
		t.Errorf("ready %v, %d writes, %d acks: want not ready, one write, no ack", p.Ready(), s.writes.Load(), srv.Message(id).Acks)
	}
}
