package audit

import (
	"fmt"
	"time"
)

// Generation is one generation's bits, for targets that keep generations
// apart and merge them across processes (a Bloom filter's union is the OR
// of its bits, so replicas can pool what they saw).
type Generation struct {
	Epoch int64 // which slice of time: Unix ns / Width
	Words []uint64
}

// Width is the time one generation covers.
func (f *Filter) Width() time.Duration { return time.Duration(f.width) }

// Params names the filter's shape; only filters with equal Params can
// exchange generations.
func (f *Filter) Params() string {
	return fmt.Sprintf("w%d-g%d-m%d-k%d", f.width, len(f.gens)-1, f.m, f.k)
}

// TakeDirty returns copies of the live generations added to since the last
// call, and marks them clean.
func (f *Filter) TakeDirty() []Generation {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Generation
	for i := range f.gens {
		g := &f.gens[i]
		if !g.dirty || !f.ok || !f.live(g.epoch, f.cur) {
			continue
		}
		g.dirty = false
		out = append(out, Generation{Epoch: g.epoch, Words: append([]uint64(nil), g.f.BitSet().Words()...)})
	}
	return out
}

// Merge ORs a generation saved elsewhere into f. A generation older than
// f's window is ignored; a newer one moves the window, as an Add would.
func (f *Filter) Merge(g Generation) error {
	if len(g.Words) != int(f.m/64) {
		return fmt.Errorf("%w: generation of %d words, want %d", ErrMismatch, len(g.Words), f.m/64)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.ok || g.Epoch > f.cur {
		f.cur, f.ok = g.Epoch, true
	}
	if !f.live(g.Epoch, f.cur) {
		return nil
	}
	s := f.slot(g.Epoch)
	if s.epoch != g.Epoch {
		s.f.ClearAll()
		s.epoch, s.n, s.full, s.dirty = g.Epoch, 0, false, false
	}
	w := s.f.BitSet().Words()
	for i, x := range g.Words {
		w[i] |= x
	}
	// The union's size is not the sum of the parts (replicas may share
	// keys): estimate it from the bits set.
	s.n = uint(s.f.ApproximatedSize())
	return nil
}

// MarkDirty marks a generation as changed, so TakeDirty returns it again
// (after a save that failed).
func (f *Filter) MarkDirty(epoch int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if s := f.slot(epoch); s.epoch == epoch {
		s.dirty = true
	}
}
