// Package audit remembers dedup keys far beyond the exact horizon, in
// little memory and approximately, so the pipeline can say when a copy that
// the horizon let through was probably a duplicate: the seeds' "a copy
// republished long after the original will pass through" becomes visible
// instead of silent.
//
// # Structure
//
// A ring of Generations+1 Bloom filters (github.com/bits-and-blooms/bloom/v3),
// each covering Horizon/Generations of time. A key is added to the filter
// of the generation its time falls in; a lookup asks every live filter.
// When time enters a new generation, the oldest filter is cleared and
// reused, so a key is remembered for between Horizon and Horizon plus one
// generation, and memory is fixed when the Filter is made: every filter is
// allocated up front for Capacity/Generations keys.
//
// # False positives
//
// A lookup is a false positive if any of the Generations+1 filters answers
// yes; at capacity Generations of them are full and one is filling. Each is
// sized for FalsePositive/(Generations+1), so the union stays at or below
// FalsePositive while the stream keeps within Capacity keys per Horizon
// (TestFalsePositiveRateAtCapacity measures it). Past capacity the rate
// climbs; Stats reports an estimate from the fill of each filter so a gauge
// shows it before anyone is misled.
//
// # Time
//
// Times are passed in, like the dedup store's, so the filter follows
// whichever clock the horizon uses (processing time, or event time). The
// newest generation is the latest time seen; a key whose time is older
// than the oldest live generation is not added.
package audit

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"

	"github.com/dedupflow/dedupflow/dedup"
)

// Defaults.
const (
	DefaultFalsePositive = 0.001
	// DefaultCapacity is 10M keys per audit horizon (about 16 new keys a
	// second for a week); at the default rate it costs about 27 MB.
	DefaultCapacity    = 10_000_000
	DefaultGenerations = 8
	// DefaultMaxBytes bounds what a mistyped capacity can allocate.
	DefaultMaxBytes = 4 << 30
)

// Options configure a Filter.
type Options struct {
	// Horizon is how long keys are remembered (at least).
	Horizon time.Duration
	// FalsePositive is the rate of "probably seen" answers for keys never
	// seen, at Capacity; between 0 and 0.5.
	FalsePositive float64
	// Capacity is how many distinct keys arrive per Horizon.
	Capacity uint
	// Generations is how many filters cover the Horizon: more means keys
	// are forgotten closer to the Horizon, at a slightly larger cost per
	// lookup.
	Generations int
	// MaxBytes refuses a configuration that would allocate more.
	MaxBytes int64
	// Logger receives over-capacity warnings; nil discards.
	Logger *slog.Logger
}

// Validate checks the options, filling defaults.
func (o *Options) Validate() error {
	if o.FalsePositive == 0 {
		o.FalsePositive = DefaultFalsePositive
	}
	if o.Capacity == 0 {
		o.Capacity = DefaultCapacity
	}
	if o.Generations == 0 {
		o.Generations = DefaultGenerations
	}
	if o.MaxBytes == 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	switch {
	case o.FalsePositive <= 0 || o.FalsePositive >= 0.5 || math.IsNaN(o.FalsePositive):
		return fmt.Errorf("audit false-positive rate %v must be between 0 and 0.5", o.FalsePositive)
	case o.Generations < 1 || o.Generations > 256:
		return fmt.Errorf("audit generations %d must be between 1 and 256", o.Generations)
	case o.Horizon < time.Duration(o.Generations)*time.Second:
		return fmt.Errorf("audit horizon %v must be at least %d s (one second per generation)", o.Horizon, o.Generations)
	case o.Capacity < uint(o.Generations):
		return fmt.Errorf("audit capacity %d must be at least %d keys", o.Capacity, o.Generations)
	}
	if b := o.bytes(); b > o.MaxBytes {
		return fmt.Errorf("audit filter for %d keys at a false-positive rate of %v needs %s, more than the %s allowed",
			o.Capacity, o.FalsePositive, human(b), human(o.MaxBytes))
	}
	return nil
}

// params are the size of each generation's filter.
func (o *Options) params() (m, k uint) {
	perGen := (o.Capacity + uint(o.Generations) - 1) / uint(o.Generations)
	m, k = bloom.EstimateParameters(perGen, o.FalsePositive/float64(o.Generations+1))
	m = (m + 63) &^ 63 // whole words: a saved filter stores words
	return m, k
}

func (o *Options) bytes() int64 {
	m, _ := o.params()
	return int64(m/8) * int64(o.Generations+1)
}

// Filter is the time-partitioned membership structure. It is safe for
// concurrent use.
type Filter struct {
	opt   Options
	width int64 // nanoseconds per generation
	m, k  uint

	mu   sync.RWMutex
	gens []gen // ring, indexed by epoch mod len
	cur  int64 // newest epoch seen; valid once started
	ok   bool  // started
}

type gen struct {
	epoch int64
	f     *bloom.BloomFilter
	n     uint // keys added that were not already there
	full  bool // over capacity warned
	dirty bool // added to since the last TakeDirty
}

const noEpoch = math.MinInt64

// New allocates a Filter (all of its memory, up front).
func New(opt Options) (*Filter, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	f := &Filter{opt: opt, width: int64(opt.Horizon) / int64(opt.Generations)}
	f.m, f.k = opt.params()
	f.gens = make([]gen, opt.Generations+1)
	for i := range f.gens {
		f.gens[i] = gen{epoch: noEpoch, f: bloom.New(f.m, f.k)}
	}
	return f, nil
}

// Horizon is how long keys are remembered (at least).
func (f *Filter) Horizon() time.Duration { return f.opt.Horizon }

// earliest and latest bound the times Unix nanoseconds can hold (years
// 1677 to 2262); times beyond are clamped, so they land in the oldest or
// newest epoch instead of wrapping around.
var earliest, latest = time.Unix(0, math.MinInt64), time.Unix(0, math.MaxInt64)

func (f *Filter) epoch(t time.Time) int64 {
	if t.Before(earliest) {
		t = earliest
	} else if t.After(latest) {
		t = latest
	}
	n := t.UnixNano()
	e := n / f.width
	if n%f.width < 0 {
		e-- // floor, for times before 1970
	}
	return e
}

func (f *Filter) slot(e int64) *gen {
	n := int64(len(f.gens))
	return &f.gens[((e%n)+n)%n]
}

// live reports whether epoch e is inside the window ending at newest.
func (f *Filter) live(e, newest int64) bool {
	return e != noEpoch && e <= newest && e >= newest-int64(f.opt.Generations)
}

// Add remembers k as seen at t.
func (f *Filter) Add(k dedup.Key, t time.Time) {
	e := f.epoch(t)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ok || e > f.cur {
		f.cur, f.ok = e, true
	}
	if !f.live(e, f.cur) {
		return // older than the audit horizon already
	}
	g := f.slot(e)
	if g.epoch != e {
		// The slot holds a generation that has left the window: reuse it.
		g.f.ClearAll()
		g.epoch, g.n, g.full, g.dirty = e, 0, false, false
	}
	if !g.f.TestAndAdd(k[:]) {
		g.n++
		g.dirty = true
		if !g.full && g.n > f.perGen() {
			g.full = true
			f.opt.Logger.Warn("audit filter generation over capacity: false positives will rise above the configured rate (raise --audit-capacity)",
				"keys", g.n, "capacity_per_generation", f.perGen(), "generation_start", time.Unix(0, e*f.width).UTC())
		}
	}
}

func (f *Filter) perGen() uint {
	return (f.opt.Capacity + uint(f.opt.Generations) - 1) / uint(f.opt.Generations)
}

// Contains reports whether k was probably added within the audit horizon
// before t (false positives at about the configured rate; no false
// negatives within Horizon).
func (f *Filter) Contains(k dedup.Key, t time.Time) bool {
	_, ok := f.Seen(k, t)
	return ok
}

// Seen is Contains, with the start of the oldest generation that holds k:
// the earliest time k can have been added, to the width of a generation
// (Horizon / Generations), so t minus it is the copy's delay, rounded up
// by less than a generation.
func (f *Filter) Seen(k dedup.Key, t time.Time) (time.Time, bool) {
	locs := bloom.Locations(k[:], f.k) // hashed once for every generation
	e := f.epoch(t)
	f.mu.RLock()
	defer f.mu.RUnlock()
	if !f.ok {
		return time.Time{}, false
	}
	newest := max(e, f.cur)
	oldest, found := int64(0), false
	for i := range f.gens {
		g := &f.gens[i]
		if g.n > 0 && f.live(g.epoch, newest) && g.f.TestLocations(locs) && (!found || g.epoch < oldest) {
			oldest, found = g.epoch, true
		}
	}
	if !found {
		return time.Time{}, false
	}
	return time.Unix(0, oldest*f.width), true
}

// Stats describe the filter for gauges.
type Stats struct {
	// Bytes is the memory of the filters' bits, fixed at New.
	Bytes int64
	// Keys is the number of keys added to the live generations, each
	// counted once per generation it was added to.
	Keys uint64
	// Capacity is the configured keys per horizon.
	Capacity uint64
	// FalsePositive is the estimated rate of false "seen" answers now, from
	// how full each live generation is.
	FalsePositive float64
}

// Stats returns the filter's current statistics.
func (f *Filter) Stats() Stats {
	f.mu.RLock()
	defer f.mu.RUnlock()
	s := Stats{Bytes: int64(f.m/8) * int64(len(f.gens)), Capacity: uint64(f.opt.Capacity)}
	miss := 1.0 // probability that no generation answers yes
	for i := range f.gens {
		g := &f.gens[i]
		if !f.ok || !f.live(g.epoch, f.cur) {
			continue
		}
		s.Keys += uint64(g.n)
		p := math.Pow(1-math.Exp(-float64(f.k)*float64(g.n)/float64(f.m)), float64(f.k))
		miss *= 1 - p
	}
	s.FalsePositive = 1 - miss
	return s
}

// ErrMismatch is returned when a filter was saved with other options.
var ErrMismatch = errors.New("audit filter saved with other options")

func human(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	}
	return fmt.Sprintf("%d KiB", b>>10)
}
