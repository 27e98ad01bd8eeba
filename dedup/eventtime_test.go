package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// recorder is a store that remembers the times it was handed.
type recorder struct {
	dedup.Store
	claims  []dedup.Claim
	expires []time.Time
}

func (r *recorder) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	r.claims = append(r.claims, c)
	return r.Store.Claim(ctx, c)
}

func (r *recorder) Commit(ctx context.Context, k dedup.Key, msgID string, exp time.Time) error {
	r.expires = append(r.expires, exp)
	return r.Store.Commit(ctx, k, msgID, exp)
}

func TestEventTime(t *testing.T) {
	ctx := context.Background()
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	type step struct {
		key    string
		msgID  string
		event  int // seconds after t0
		status dedup.Status
		kind   dedup.Kind
		late   bool
	}
	// Horizon 60 s, lateness 30 s: the watermark is the highest event
	// time minus 30 s, and a key expires when it passes event + 60 s.
	cases := []struct {
		name  string
		clock int // processing time, seconds after t0
		steps []step
	}{
		{"out of order within lateness: still a duplicate", 1000, []step{
			{key: "a", msgID: "m1", event: 0, status: dedup.Proceed},
			{key: "b", msgID: "m2", event: 80, status: dedup.Proceed}, // watermark 50 < 0+60
			{key: "a", msgID: "m3", event: 0, status: dedup.Duplicate, kind: dedup.Republish},
			{key: "a", msgID: "m1", event: 0, status: dedup.Duplicate, kind: dedup.Redelivery},
		}},
		{"the watermark passes event + horizon: the key expired, and the copy is too late", 1000, []step{
			{key: "a", msgID: "m1", event: 0, status: dedup.Proceed},
			{key: "b", msgID: "m2", event: 95, status: dedup.Proceed}, // watermark 65 >= 60
			{key: "a", msgID: "m3", event: 0, late: true},
		}},
		{"a copy with a later event time after the key expired is new", 1000, []step{
			{key: "a", msgID: "m1", event: 0, status: dedup.Proceed},
			{key: "b", msgID: "m2", event: 95, status: dedup.Proceed},
			{key: "a", msgID: "m3", event: 90, status: dedup.Proceed},
		}},
		{"expiry counts from the event time, not from arrival", 1000, []step{
			{key: "b", msgID: "m0", event: 100, status: dedup.Proceed}, // watermark 70
			{key: "a", msgID: "m1", event: 20, status: dedup.Proceed},  // 20+60 > 70: judged, expires at 80
			{key: "c", msgID: "m2", event: 105, status: dedup.Proceed}, // watermark 75
			{key: "a", msgID: "m3", event: 20, status: dedup.Duplicate, kind: dedup.Republish},
			{key: "c", msgID: "m4", event: 111, status: dedup.Duplicate, kind: dedup.Republish}, // watermark 81
			{key: "a", msgID: "m5", event: 25, status: dedup.Proceed},                           // 80 <= 81: expired
		}},
		{"an event stamped in the future does not move the watermark past the clock", 10, []step{
			{key: "a", msgID: "m1", event: 0, status: dedup.Proceed},
			{key: "z", msgID: "m2", event: 86400, status: dedup.Proceed}, // clock is t0+10s
			{key: "a", msgID: "m3", event: 0, status: dedup.Duplicate, kind: dedup.Republish},
		}},
	}
	// Each case runs through Claim, and through ClaimBatch a message at a
	// time: the batch path judges event time as Claim does.
	for _, c := range cases {
		for _, batched := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/batched=%v", c.name, batched), func(t *testing.T) {
				rec := &recorder{Store: mem.New()}
				clock := func() time.Time { return at(c.clock) }
				d := must(dedup.New(rec, dedup.Options{Policy: dedup.Policy{Horizon: time.Minute, Lease: 5 * time.Second, TimeDomain: dedup.EventTime, AllowedLateness: 30 * time.Second}, Now: clock}))
				claim := func(k dedup.Key, msgID string, et time.Time) (dedup.Verdict, dedup.Ticket, error) {
					if !batched {
						return d.Claim(ctx, k, msgID, et)
					}
					bs := []dedup.BatchClaim{{Key: k, MsgID: msgID, EventTime: et}}
					d.ClaimBatch(ctx, bs)
					return bs[0].Verdict, bs[0].Ticket, bs[0].Err
				}
				for i, s := range c.steps {
					v, tk, err := claim(dedup.KeyOf(s.key), s.msgID, at(s.event))
					if s.late {
						if !errors.Is(err, dedup.ErrTooLate) {
							t.Fatalf("step %d: %v, %v; want too late", i, v.Status, err)
						}
						continue
					}
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if v.Status != s.status || v.Kind != s.kind {
						t.Fatalf("step %d: claim %s/%s = %v/%v, want %v/%v", i, s.key, s.msgID, v.Status, v.Kind, s.status, s.kind)
					}
					if v.Status == dedup.Proceed {
						last := rec.claims[len(rec.claims)-1]
						wm, _ := d.Watermark()
						if !last.Now.Equal(wm) || !last.LeaseUntil.Equal(wm.Add(5*time.Second)) {
							t.Fatalf("step %d: claim at %v lease %v, want the watermark %v and watermark + lease", i, last.Now, last.LeaseUntil, wm)
						}
						if err := d.Commit(ctx, tk); err != nil {
							t.Fatal(err)
						}
						// Event time + horizon, the event time held to the clock.
						if exp := rec.expires[len(rec.expires)-1]; !exp.Equal(at(min(s.event, c.clock)).Add(time.Minute)) {
							t.Fatalf("step %d: committed to expire at %v, want event time (at most the clock) + horizon", i, exp)
						}
					}
				}
			})
		}
	}
}

// TestEventTimeBatchOrder: in one batch each message is judged at the
// watermark its predecessors left, as one Claim after another: an old
// event before a new one is still judged, the same old event after it is
// too late.
func TestEventTimeBatchOrder(t *testing.T) {
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d := must(dedup.New(mem.New(), dedup.Options{Policy: dedup.Policy{Horizon: time.Minute, TimeDomain: dedup.EventTime, AllowedLateness: 30 * time.Second}, Now: func() time.Time { return t0.Add(time.Hour) }}))
	bs := []dedup.BatchClaim{
		{Key: dedup.KeyOf("a"), MsgID: "m1", EventTime: t0},
		{Key: dedup.KeyOf("b"), MsgID: "m2", EventTime: t0.Add(95 * time.Second)}, // watermark 65 s
		{Key: dedup.KeyOf("c"), MsgID: "m3", EventTime: t0},
	}
	d.ClaimBatch(context.Background(), bs)
	if bs[0].Err != nil || bs[0].Verdict.Status != dedup.Proceed || bs[1].Err != nil || bs[1].Verdict.Status != dedup.Proceed {
		t.Fatalf("first two: %v %v, %v %v; want both to proceed", bs[0].Verdict.Status, bs[0].Err, bs[1].Verdict.Status, bs[1].Err)
	}
	if !errors.Is(bs[2].Err, dedup.ErrTooLate) {
		t.Fatalf("the old event after the new one: %v %v, want too late", bs[2].Verdict.Status, bs[2].Err)
	}
	if !bs[1].Ticket.Expires.Equal(t0.Add(155*time.Second)) || !bs[0].Ticket.Expires.Equal(t0.Add(time.Minute)) {
		t.Fatalf("expiries %v and %v: want each event time + horizon", bs[0].Ticket.Expires, bs[1].Ticket.Expires)
	}
}

func TestProcessingTimeIgnoresEventTime(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d := must(dedup.New(mem.New(), dedup.Options{Now: func() time.Time { return now }}))
	if _, ok := d.Watermark(); ok || d.Domain() != dedup.ProcessingTime {
		t.Fatal("processing time has a watermark")
	}
	// An event from a year ago is judged like any other.
	if v, _, err := d.Claim(context.Background(), dedup.KeyOf("a"), "m1", now.AddDate(-1, 0, 0)); err != nil || v.Status != dedup.Proceed {
		t.Fatalf("%v, %v", v.Status, err)
	}
}

func TestParseTimeDomainAndLate(t *testing.T) {
	if d, err := dedup.ParseTimeDomain("event"); err != nil || d != dedup.EventTime || d.String() != "event" {
		t.Errorf("event: %v %v", d, err)
	}
	if d, err := dedup.ParseTimeDomain(""); err != nil || d != dedup.ProcessingTime {
		t.Errorf("default: %v %v", d, err)
	}
	if _, err := dedup.ParseTimeDomain("ingest"); err == nil {
		t.Error("ingest accepted")
	}
	if l, err := dedup.ParseLate("dead-letter"); err != nil || l != dedup.LateDeadLetter || l.String() != "dead-letter" {
		t.Errorf("dead-letter: %v %v", l, err)
	}
	if _, err := dedup.ParseLate("drop"); err == nil {
		t.Error("drop accepted")
	}
	o := dedup.Options{Policy: dedup.Policy{TimeDomain: dedup.EventTime, AllowedLateness: -time.Second}}
	if err := o.Validate(); err == nil {
		t.Error("negative lateness accepted")
	}
}

// Timestamps are accepted from year 1 to 9999, beyond what Unix
// nanoseconds hold: they must not wrap the watermark around.
func TestEventTimeExtremes(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	d := must(dedup.New(mem.New(), dedup.Options{Policy: dedup.Policy{Horizon: time.Minute, TimeDomain: dedup.EventTime, AllowedLateness: time.Second}, Now: func() time.Time { return now }}))
	ancient := time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, _, err := d.Claim(ctx, dedup.KeyOf("a"), "m1", ancient); !errors.Is(err, dedup.ErrTooLate) {
		t.Fatalf("year 1 as the first event: %v, want too late", err)
	}
	if _, ok := d.Watermark(); ok {
		t.Fatal("year 1 set a watermark")
	}
	if v, _, err := d.Claim(ctx, dedup.KeyOf("b"), "m2", time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)); err != nil || v.Status != dedup.Proceed {
		t.Fatalf("year 9999: %v, %v", v.Status, err)
	}
	if wm, ok := d.Watermark(); !ok || !wm.Equal(now.Add(-time.Second)) {
		t.Fatalf("watermark %v after a year-9999 event, want the clock minus the lateness", wm)
	}
	if v, _, err := d.Claim(ctx, dedup.KeyOf("c"), "m3", now); err != nil || v.Status != dedup.Proceed {
		t.Fatalf("an event now after one far in the future: %v, %v", v.Status, err)
	}
}
