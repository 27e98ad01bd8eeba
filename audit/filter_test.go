package audit_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/dedup"
)

var t0 = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)

// keyN is the i-th test key: distinct, uniformly spread, cheap (the real
// keys are truncated SHA-256, as uniform as this).
func keyN(i uint64) dedup.Key {
	var k dedup.Key
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	binary.LittleEndian.PutUint64(k[:8], z^z>>31)
	binary.LittleEndian.PutUint64(k[8:], z*0x9e3779b97f4a7c15)
	return k
}

func newFilter(t testing.TB, o audit.Options) *audit.Filter {
	t.Helper()
	f, err := audit.New(o)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestRemembersForTheHorizon(t *testing.T) {
	const day = 24 * time.Hour
	f := newFilter(t, audit.Options{Horizon: 7 * day, Capacity: 10_000})
	k, other := dedup.KeyOf("order-17"), dedup.KeyOf("order-18")
	if f.Contains(k, t0) {
		t.Fatal("empty filter contains a key")
	}
	f.Add(k, t0)
	for _, d := range []time.Duration{0, time.Minute, 3 * day, 7*day - time.Second} {
		if !f.Contains(k, t0.Add(d)) {
			t.Errorf("forgot the key after %v, inside the 7-day audit horizon", d)
		}
	}
	if f.Contains(other, t0.Add(time.Hour)) {
		t.Error("a key never added is reported (a false positive at 1 key in 10k capacity is near impossible)")
	}
	// Later keys rotate generations; the first key leaves after at most
	// one generation (7d/8) beyond the horizon.
	for h := 0; h <= 8*24; h++ {
		f.Add(keyN(uint64(h)), t0.Add(time.Duration(h)*time.Hour))
	}
	if f.Contains(k, t0.Add(8*day)) {
		t.Error("still remembered after horizon + one generation")
	}
	// An add older than the whole window is not kept.
	f.Add(other, t0)
	if f.Contains(other, t0.Add(8*day)) {
		t.Error("a key older than the window was added")
	}
}

// A lookup at a time past the newest generation sees the older ones age
// out even before anything new is added.
func TestContainsAgesWithoutAdds(t *testing.T) {
	f := newFilter(t, audit.Options{Horizon: 8 * time.Hour, Capacity: 1000})
	k := dedup.KeyOf("k")
	f.Add(k, t0)
	if !f.Contains(k, t0.Add(8*time.Hour)) {
		t.Error("forgot within horizon")
	}
	if f.Contains(k, t0.Add(10*time.Hour)) {
		t.Error("remembered long past the horizon with no adds in between")
	}
}

// At the configured capacity, spread over the horizon, the measured false
// positive rate is within 2× of the configured one.
func TestFalsePositiveRateAtCapacity(t *testing.T) {
	const (
		capacity = 100_000
		probes   = 400_000
		rate     = 0.001
	)
	horizon := 7 * 24 * time.Hour
	f := newFilter(t, audit.Options{Horizon: horizon, Capacity: capacity, FalsePositive: rate})
	step := horizon / capacity
	for i := 0; i < capacity; i++ {
		f.Add(keyN(uint64(i)), t0.Add(time.Duration(i)*step))
	}
	end := t0.Add(horizon)
	for i := 0; i < capacity; i += 997 {
		if !f.Contains(keyN(uint64(i)), end) {
			t.Fatalf("key %d added within the horizon is not found", i)
		}
	}
	fp := 0
	for i := 0; i < probes; i++ {
		if f.Contains(keyN(uint64(capacity+i)), end) {
			fp++
		}
	}
	measured := float64(fp) / probes
	st := f.Stats()
	t.Logf("capacity %d, configured %.4f: measured %.5f (%d of %d), estimated %.5f, %d keys, %d bytes (%.1f bits/key)",
		capacity, rate, measured, fp, probes, st.FalsePositive, st.Keys, st.Bytes, float64(st.Bytes*8)/capacity)
	if measured > 2*rate || measured < rate/2 {
		t.Errorf("measured false-positive rate %.5f is not within 2× of the configured %.4f", measured, rate)
	}
	if st.FalsePositive > 2*rate || st.FalsePositive < rate/2 {
		t.Errorf("estimated rate %.5f is not within 2× of the configured %.4f", st.FalsePositive, rate)
	}
	if st.Keys < capacity*99/100 || st.Keys > capacity {
		t.Errorf("stats count %d keys, want about %d", st.Keys, capacity)
	}
}

func TestSnapshotRoundTrip(t *testing.T) {
	opt := audit.Options{Horizon: 7 * 24 * time.Hour, Capacity: 50_000}
	f := newFilter(t, opt)
	for i := 0; i < 20_000; i++ {
		f.Add(keyN(uint64(i)), t0.Add(time.Duration(i)*30*time.Second))
	}
	path := filepath.Join(t.TempDir(), "state.db.audit")
	if err := f.SaveFile(path); err != nil {
		t.Fatal(err)
	}
	g := newFilter(t, opt)
	if found, err := g.LoadFile(path); err != nil || !found {
		t.Fatalf("load: %v, %v", found, err)
	}
	at := t0.Add(20_000 * 30 * time.Second)
	for i := 0; i < 20_000; i++ {
		if !g.Contains(keyN(uint64(i)), at) {
			t.Fatalf("key %d lost in the snapshot", i)
		}
	}
	if f.Stats() != g.Stats() {
		t.Errorf("stats differ after reload: %+v vs %+v", f.Stats(), g.Stats())
	}

	t.Run("missing file is a first start", func(t *testing.T) {
		if found, err := newFilter(t, opt).LoadFile(filepath.Join(t.TempDir(), "none")); found || err != nil {
			t.Fatalf("%v, %v", found, err)
		}
	})
	t.Run("other options are refused", func(t *testing.T) {
		o := opt
		o.Capacity *= 2
		h := newFilter(t, o)
		if _, err := h.LoadFile(path); !errors.Is(err, audit.ErrMismatch) {
			t.Fatalf("load with another capacity: %v, want ErrMismatch", err)
		}
	})
	t.Run("damage is detected and changes nothing", func(t *testing.T) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, bad := range [][]byte{b[:len(b)/2], flip(b, len(b)/2), flip(b, len(b)-1), []byte("hello")} {
			h := newFilter(t, opt)
			k := dedup.KeyOf("kept")
			h.Add(k, t0)
			if _, err := h.ReadFrom(bytes.NewReader(bad)); err == nil {
				t.Fatal("damaged snapshot accepted")
			}
			if !h.Contains(k, t0) || h.Stats().Keys != 1 {
				t.Fatal("a refused snapshot changed the filter")
			}
		}
	})
}

func flip(b []byte, i int) []byte {
	c := bytes.Clone(b)
	c[i] ^= 0x10
	return c
}

func TestOptionsValidate(t *testing.T) {
	bad := []audit.Options{
		{Horizon: time.Hour, FalsePositive: 0.6},
		{Horizon: time.Hour, FalsePositive: -1},
		{Horizon: 3 * time.Second},                 // under a second per generation
		{Horizon: time.Hour, Capacity: 3},          // fewer keys than generations
		{Horizon: time.Hour, Capacity: 1 << 40},    // terabytes
		{Horizon: time.Hour, Generations: 100_000}, // absurd
	}
	for _, o := range bad {
		if err := o.Validate(); err == nil {
			t.Errorf("%+v accepted", o)
		}
	}
	o := audit.Options{Horizon: time.Hour}
	if err := o.Validate(); err != nil || o.Capacity != audit.DefaultCapacity || o.FalsePositive != audit.DefaultFalsePositive {
		t.Errorf("defaults: %+v, %v", o, err)
	}
}

// Adds, lookups, stats and snapshots at once, for the race detector.
func TestConcurrentUse(t *testing.T) {
	f := newFilter(t, audit.Options{Horizon: time.Hour, Capacity: 10_000})
	var wg sync.WaitGroup
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				at := t0.Add(time.Duration(i) * time.Second)
				k := keyN(uint64(w*10_000 + i))
				f.Add(k, at)
				if !f.Contains(k, at) {
					panic(fmt.Sprintf("key %d lost", i))
				}
				if i%500 == 0 {
					_ = f.Stats()
					if _, err := f.WriteTo(new(bytes.Buffer)); err != nil {
						panic(err)
					}
				}
			}
		}()
	}
	wg.Wait()
}

// The snapshotter saves periodically and on Stop, and a new one loads it.
func TestSaver(t *testing.T) {
	opt := audit.Options{Horizon: time.Hour, Capacity: 1000}
	path := filepath.Join(t.TempDir(), "audit")
	f := newFilter(t, opt)
	s := audit.StartSaving(t.Context(), f, audit.File(path), 10*time.Millisecond, nil)
	f.Add(dedup.KeyOf("early"), t0)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if _, err := os.Stat(path); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no periodic snapshot")
		}
	}
	f.Add(dedup.KeyOf("late"), t0)
	s.Stop()
	s.Stop() // idempotent
	g := newFilter(t, opt)
	s2 := audit.StartSaving(t.Context(), g, audit.File(path), time.Hour, nil)
	defer s2.Stop()
	if !g.Contains(dedup.KeyOf("early"), t0) || !g.Contains(dedup.KeyOf("late"), t0) {
		t.Fatal("keys added before Stop are not in the snapshot")
	}
	if m, _ := filepath.Glob(path + ".tmp*"); len(m) != 0 {
		t.Fatalf("temporary files left: %v", m)
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "1.5d": 36 * time.Hour, "36h": 36 * time.Hour, "0": 0, "90m": 90 * time.Minute} {
		if got, err := audit.ParseDuration(in); err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"d", "7days", "-1d", "1e9d", "week", ""} {
		if _, err := audit.ParseDuration(in); err == nil {
			t.Errorf("ParseDuration(%q) accepted", in)
		}
	}
}

// TakeDirty hands out what changed once; Merge ORs it into another
// filter, which then knows the keys.
func TestTakeDirtyAndMerge(t *testing.T) {
	opt := audit.Options{Horizon: 8 * time.Hour, Capacity: 1000}
	a, b := newFilter(t, opt), newFilter(t, opt)
	a.Add(dedup.KeyOf("x"), t0)
	a.Add(dedup.KeyOf("y"), t0.Add(2*time.Hour))
	gens := a.TakeDirty()
	if len(gens) != 2 || len(a.TakeDirty()) != 0 {
		t.Fatalf("dirty generations %d, then %d; want 2, then none", len(gens), len(a.TakeDirty()))
	}
	for _, g := range gens {
		if err := b.Merge(g); err != nil {
			t.Fatal(err)
		}
	}
	if !b.Contains(dedup.KeyOf("x"), t0.Add(3*time.Hour)) || !b.Contains(dedup.KeyOf("y"), t0.Add(3*time.Hour)) || a.Params() != b.Params() {
		t.Fatal("merged filter lacks the keys")
	}
	if err := b.Merge(audit.Generation{Epoch: 1, Words: make([]uint64, 3)}); !errors.Is(err, audit.ErrMismatch) {
		t.Fatalf("merge of a generation of another size: %v", err)
	}
	a.MarkDirty(gens[0].Epoch)
	if len(a.TakeDirty()) != 1 {
		t.Fatal("MarkDirty did not mark")
	}
}

// Times beyond Unix nanoseconds (event times of year 1 or 9999) do not
// wrap the generations around.
func TestExtremeTimes(t *testing.T) {
	f := newFilter(t, audit.Options{Horizon: 8 * time.Hour, Capacity: 1000})
	k := dedup.KeyOf("k")
	f.Add(k, t0)
	f.Add(dedup.KeyOf("old"), time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC))
	if !f.Contains(k, t0) || f.Contains(dedup.KeyOf("old"), t0) {
		t.Fatal("an add in year 1 disturbed the window")
	}
	if f.Contains(k, time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)) {
		t.Fatal("a lookup in year 9999 still sees today's key")
	}
}

// Seen tells when a key was first added, to the width of a generation, so
// a late copy's delay can be estimated; a key added again later keeps its
// first generation.
func TestSeenGivesTheFirstGeneration(t *testing.T) {
	const day = 24 * time.Hour
	f := newFilter(t, audit.Options{Horizon: 8 * day, Generations: 8, Capacity: 10_000})
	k := dedup.KeyOf("order-17")
	f.Add(k, t0)
	f.Add(k, t0.Add(3*day))
	seen, ok := f.Seen(k, t0.Add(5*day))
	if !ok || seen.After(t0) || t0.Sub(seen) >= day {
		t.Fatalf("Seen = %v, %v; want within the day (one generation) before %v", seen, ok, t0)
	}
	if _, ok := f.Seen(dedup.KeyOf("order-18"), t0.Add(5*day)); ok {
		t.Error("a key never added is seen")
	}
}
