package dedup_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time      { return c.t }
func (c *clock) add(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock               { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestDeduperProtocol(t *testing.T) {
	ctx := context.Background()
	k := dedup.KeyOf("456")
	type step struct {
		op     string // claim, commit, release, wait
		msgID  string
		status dedup.Status
		kind   dedup.Kind
		wait   time.Duration
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"first copy proceeds, later copies are republishes", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "commit", msgID: "m2"},
			{op: "claim", msgID: "m3", status: dedup.Duplicate, kind: dedup.Republish},
			{op: "claim", msgID: "m4", status: dedup.Duplicate, kind: dedup.Republish},
		}},
		{"same message again is a redelivery", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "commit", msgID: "m2"},
			{op: "claim", msgID: "m2", status: dedup.Duplicate, kind: dedup.Redelivery},
		}},
		{"copy while the first is being written waits", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "claim", msgID: "m3", status: dedup.InFlight},
			{op: "commit", msgID: "m2"},
			{op: "claim", msgID: "m3", status: dedup.Duplicate, kind: dedup.Republish},
		}},
		{"redelivery overtaking its own write waits", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "claim", msgID: "m2", status: dedup.InFlight},
		}},
		{"failed write releases: the next copy proceeds", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "release", msgID: "m2"},
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "commit", msgID: "m2"},
			{op: "claim", msgID: "m3", status: dedup.Duplicate, kind: dedup.Republish},
		}},
		{"after the horizon a copy passes", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "commit", msgID: "m2"},
			{op: "wait", wait: 10*time.Minute - time.Second},
			{op: "claim", msgID: "m3", status: dedup.Duplicate, kind: dedup.Republish},
			{op: "wait", wait: 2 * time.Second},
			{op: "claim", msgID: "m4", status: dedup.Proceed},
		}},
		{"horizon counts from first sight, not from commit", []step{
			{op: "claim", msgID: "m2", status: dedup.Proceed},
			{op: "wait", wait: 4 * time.Minute},
			{op: "commit", msgID: "m2"},
			{op: "wait", wait: 6*time.Minute + time.Second},
			{op: "claim", msgID: "m3", status: dedup.Proceed},
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clk := newClock()
			d := must(dedup.New(mem.New(), dedup.Options{Policy: dedup.Policy{Horizon: 10 * time.Minute}, Now: clk.now}))
			tickets := map[string]dedup.Ticket{}
			for i, s := range c.steps {
				switch s.op {
				case "claim":
					v, tk, err := d.Claim(ctx, k, s.msgID, time.Time{})
					if err != nil {
						t.Fatal(err)
					}
					if v.Status != s.status || v.Kind != s.kind {
						t.Fatalf("step %d: claim %s = %v/%v, want %v/%v", i, s.msgID, v.Status, v.Kind, s.status, s.kind)
					}
					if v.Status == dedup.Proceed {
						tickets[s.msgID] = tk
					}
				case "commit":
					if err := d.Commit(ctx, tickets[s.msgID]); err != nil {
						t.Fatal(err)
					}
				case "release":
					if err := d.Release(ctx, tickets[s.msgID]); err != nil {
						t.Fatal(err)
					}
				case "wait":
					clk.add(s.wait)
				}
			}
		})
	}
}

// flaky is a store that is down while down is set.
type flaky struct {
	dedup.Store
	down bool
}

func (f *flaky) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	if f.down {
		return dedup.Verdict{}, fmt.Errorf("dial: %w", dedup.ErrUnavailable)
	}
	return f.Store.Claim(ctx, c)
}

func TestDeduperStoreDown(t *testing.T) {
	st := &flaky{Store: mem.New(), down: true}
	d := must(dedup.New(st, dedup.Options{}))
	k := dedup.KeyOf("k")
	if _, _, err := d.Claim(context.Background(), k, "m1", time.Time{}); !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("claim on a down store: %v, want a transient ErrUnavailable", err)
	}
	// The failed claim must not leave the key busy in this process: once
	// the store is back, the redelivered message proceeds.
	st.down = false
	if v, _, err := d.Claim(context.Background(), k, "m1", time.Time{}); err != nil || v.Status != dedup.Proceed {
		t.Fatalf("after recovery: %v, %v; want proceed", v.Status, err)
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, o := range []dedup.Options{{Policy: dedup.Policy{Horizon: 999 * time.Millisecond}}, {Policy: dedup.Policy{Lease: -time.Second}}} {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o := dedup.Options{}
	if err := o.Validate(); err != nil || o.Horizon != dedup.DefaultHorizon || o.Lease != dedup.DefaultLease {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}

// TestDeduperLocalWait: with LocalWait a copy of a key this process is
// writing gets its final verdict when the write ends, instead of InFlight.
func TestDeduperLocalWait(t *testing.T) {
	ctx := context.Background()
	k := dedup.KeyOf("456")
	type result struct {
		v   dedup.Verdict
		err error
	}
	claimLater := func(d *dedup.Deduper, ctx context.Context, msgID string) chan result {
		c := make(chan result, 1)
		go func() {
			v, _, err := d.Claim(ctx, k, msgID, time.Time{})
			c <- result{v, err}
		}()
		return c
	}
	waiting := func(c chan result) {
		t.Helper()
		select {
		case r := <-c:
			t.Fatalf("copy answered %v before the first write ended", r.v.Status)
		case <-time.After(50 * time.Millisecond):
		}
	}
	got := func(c chan result, want dedup.Status, kind dedup.Kind) dedup.Verdict {
		t.Helper()
		select {
		case r := <-c:
			if r.err != nil || r.v.Status != want || r.v.Kind != kind {
				t.Fatalf("copy: %v/%v (%v), want %v/%v", r.v.Status, r.v.Kind, r.err, want, kind)
			}
			return r.v
		case <-time.After(5 * time.Second):
			t.Fatal("copy still waiting 5 s after the first write ended")
		}
		return dedup.Verdict{}
	}
	opts := dedup.Options{LocalWait: time.Minute}

	t.Run("commit makes waiting copies duplicates", func(t *testing.T) {
		d := must(dedup.New(mem.New(), opts))
		first, tk, _ := d.Claim(ctx, k, "m1", time.Time{})
		if first.Waited != 0 {
			t.Errorf("a claim of a free key reports a wait of %v", first.Waited)
		}
		again, copy := claimLater(d, ctx, "m1"), claimLater(d, ctx, "m2")
		waiting(again)
		waiting(copy)
		if err := d.Commit(ctx, tk); err != nil {
			t.Fatal(err)
		}
		got(again, dedup.Duplicate, dedup.Redelivery)
		// The wait is reported, so latency metrics can leave it out of
		// the store's share.
		if v := got(copy, dedup.Duplicate, dedup.Republish); v.Waited < 40*time.Millisecond {
			t.Errorf("copy reports a wait of %v, want at least the 50ms it was held", v.Waited)
		}
	})
	t.Run("release lets one waiting copy proceed", func(t *testing.T) {
		d := must(dedup.New(mem.New(), opts))
		_, tk, _ := d.Claim(ctx, k, "m1", time.Time{})
		copy := claimLater(d, ctx, "m2")
		waiting(copy)
		if err := d.Release(ctx, tk); err != nil {
			t.Fatal(err)
		}
		got(copy, dedup.Proceed, 0)
	})
	t.Run("a cancelled context ends the wait as in flight", func(t *testing.T) {
		d := must(dedup.New(mem.New(), opts))
		d.Claim(ctx, k, "m1", time.Time{})
		cctx, cancel := context.WithCancel(ctx)
		copy := claimLater(d, cctx, "m2")
		waiting(copy)
		cancel()
		got(copy, dedup.InFlight, 0)
	})
	t.Run("the wait is bounded", func(t *testing.T) {
		d := must(dedup.New(mem.New(), dedup.Options{LocalWait: 100 * time.Millisecond}))
		d.Claim(ctx, k, "m1", time.Time{})
		got(claimLater(d, ctx, "m2"), dedup.InFlight, 0)
	})
	if _, err := dedup.New(mem.New(), dedup.Options{LocalWait: -time.Second}); err == nil {
		t.Error("a negative LocalWait was accepted")
	}
}

// syncClock is a settable clock that goroutines may read.
type syncClock struct{ ns atomic.Int64 }

func newSyncClock() *syncClock {
	c := &syncClock{}
	c.ns.Store(newClock().t.UnixNano())
	return c
}
func (c *syncClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *syncClock) add(d time.Duration) { c.ns.Add(int64(d)) }

// TestDeduperLocalWaitLease: a copy that waited for a local write gets a
// whole lease from the end of its wait. Measured from before the wait, the
// lease would already be over for another replica sharing the store, which
// would take the key over and write it too.
func TestDeduperLocalWaitLease(t *testing.T) {
	ctx := context.Background()
	k := dedup.KeyOf("456")
	for _, domain := range []dedup.TimeDomain{dedup.ProcessingTime, dedup.EventTime} {
		t.Run(fmt.Sprintf("domain %d", domain), func(t *testing.T) {
			// Two replicas sharing one store, as with Redis.
			clk, shared := newSyncClock(), mem.New()
			opts := dedup.Options{Policy: dedup.Policy{Lease: 30 * time.Second, TimeDomain: domain}, Now: clk.now, LocalWait: time.Minute}
			d1, d2 := must(dedup.New(shared, opts)), must(dedup.New(shared, opts))
			_, tk, _ := d1.Claim(ctx, k, "m1", clk.now())
			copy := make(chan dedup.Verdict, 1)
			go func() {
				v, _, _ := d1.Claim(ctx, k, "m2", clk.now())
				copy <- v
			}()
			select {
			case v := <-copy:
				t.Fatalf("copy answered %v before the first write ended", v.Status)
			case <-time.After(50 * time.Millisecond):
			}
			clk.add(20 * time.Second)
			if domain == dedup.EventTime { // the watermark moves on with other keys
				d1.Claim(ctx, dedup.KeyOf("other"), "o1", clk.now())
			}
			if err := d1.Release(ctx, tk); err != nil {
				t.Fatal(err)
			}
			select {
			case v := <-copy:
				if v.Status != dedup.Proceed {
					t.Fatalf("copy after the release: %v, want Proceed", v.Status)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("copy still waiting 5 s after the release")
			}
			// 15 s into the copy's write its lease must still keep the
			// other replica away.
			clk.add(15 * time.Second)
			v, _, err := d2.Claim(ctx, k, "m3", clk.now())
			if err != nil || v.Status != dedup.InFlight {
				t.Fatalf("other replica 15 s into the copy's write: %v (%v), want InFlight: the lease ran from before the wait", v.Status, err)
			}
		})
	}
}

// A caught copy's Age is the time since its key's first sight; with the
// sliding mode each copy keeps the key another horizon (and Age runs from
// the latest copy), with the fixed mode the key expires a horizon after
// first sight whatever came meanwhile.
func TestHorizonModes(t *testing.T) {
	for _, mode := range []dedup.HorizonMode{dedup.Fixed, dedup.Sliding} {
		t.Run(mode.String(), func(t *testing.T) {
			c := newClock()
			d, err := dedup.New(mem.New(), dedup.Options{Policy: dedup.Policy{HorizonMode: mode}, Now: c.now})
			if err != nil {
				t.Fatal(err)
			}
			k := dedup.KeyOf("k")
			_, tk, err := d.Claim(t.Context(), k, "m1", time.Time{})
			if err != nil || d.Commit(t.Context(), tk) != nil {
				t.Fatal(err)
			}
			c.add(8 * time.Minute)
			v, _, err := d.Claim(t.Context(), k, "m2", time.Time{})
			if err != nil || v.Status != dedup.Duplicate || v.Age < 8*time.Minute || v.Age > 8*time.Minute+20*time.Millisecond {
				t.Fatalf("copy 8m after first sight: %+v, %v", v, err)
			}
			c.add(7 * time.Minute) // 15m after first sight, 7m after the copy
			v, _, err = d.Claim(t.Context(), k, "m3", time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			wantStatus := map[dedup.HorizonMode]dedup.Status{dedup.Fixed: dedup.Proceed, dedup.Sliding: dedup.Duplicate}[mode]
			if v.Status != wantStatus {
				t.Fatalf("15m after first sight, 7m after a caught copy: %v, want %v", v.Status, wantStatus)
			}
			if mode == dedup.Sliding && (v.Age < 7*time.Minute || v.Age > 7*time.Minute+20*time.Millisecond) {
				t.Errorf("sliding Age %v, want the 7m since the latest copy", v.Age)
			}
		})
	}
	if _, err := dedup.ParseHorizonMode("growing"); err == nil || !strings.Contains(err.Error(), "fixed or sliding") {
		t.Errorf("ParseHorizonMode(growing) = %v", err)
	}
}
