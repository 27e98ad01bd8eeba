// Package table is the hash table of the memory and disk stores: one
// 24-byte slot per key, claimed or committed alike (a claim is the slot its
// commit then overwrites), so claim and commit touch one table and nothing
// else.
package table

import (
	"math/bits"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// entry is one key. meta packs, from the top, the expiry (or a claim's
// lease end) in ticks, whether the key is only claimed, and the low bits of
// the message tag of the claimant or committer; 0 marks an empty slot
// (expiry ticks start at 1).
type entry struct {
	hi, lo uint64
	meta   uint64
}

const (
	tagBits    = 28 // a tag collision only mislabels a republish as a redelivery
	tagMask    = 1<<tagBits - 1
	pendingBit = 1 << tagBits
	expShift   = tagBits + 1
	maxTick    = 1<<(64-expShift) - 1 // 35 bits of 10 ms: about 10.9 years
)

func pack(exp uint64, pending bool, tag uint32) uint64 {
	m := exp<<expShift | uint64(tag)&tagMask
	if pending {
		m |= pendingBit
	}
	return m
}

func (e *entry) until() uint64         { return e.meta >> expShift }
func (e *entry) pending() bool         { return e.meta&pendingBit != 0 }
func (e *entry) tag() uint32           { return uint32(e.meta & tagMask) }
func (e *entry) empty() bool           { return e.meta == 0 }
func (e *entry) is(hi, lo uint64) bool { return e.hi == hi && e.lo == lo }

// Table is an open-addressing hash table with linear probing and Robin
// Hood displacement, plus the clock its expiries are counted on. Its size
// is not a power of two (the slot is picked with a multiply-shift), so it
// grows by 1.25× and stays between 72% and 90% full: memory per live key
// stays near 24/0.8 bytes where a Go map of the same entries doubles and
// sits half empty after each growth. Expired entries are removed by a
// cursor that sweeps a few slots on every claim that inserts, and by Sweep.
// A Table is not safe for concurrent use.
type Table struct {
	slots  []entry
	n      int // occupied slots, expired ones included until swept
	cursor int // next slot the sweep looks at
	clock
}

const (
	maxLoad  = 0.9
	loadFill = 0.8 // how full a table sized for a known count starts
	growBy   = 1.25
	minSlots = 16
	sweepPer = 8 // slots swept per inserting claim: expired keys linger for under a tenth of the live count
)

// New returns a table sized for keys keys.
func New(keys int) *Table {
	return &Table{slots: make([]entry, max(minSlots, int(float64(keys)/loadFill)+1))}
}

// Len is the number of keys held, expired ones not yet swept included.
func (t *Table) Len() int { return t.n }

// Claim gives the claim verdict for the key at now (Unix ns) by the
// message with tag and, when it is Proceed, holds the key for that message
// until leaseUntil. With extend > 0 (the sliding horizon), a Duplicate
// also moves the key's expiry to extend, if that is later.
func (t *Table) Claim(k dedup.Key, tag uint32, now, leaseUntil, extend int64) dedup.Verdict {
	v, _ := t.ClaimOwner(k, tag, now, leaseUntil, extend)
	return v
}

// ClaimOwner is Claim, and also tells whose the key is after it: the tag
// of the message that committed or holds it. A store that writes a sliding
// extension down needs it, since the copy that extends may be another's.
func (t *Table) ClaimOwner(k dedup.Key, tag uint32, now, leaseUntil, extend int64) (dedup.Verdict, uint32) {
	t.saw(now)
	lease := t.until(leaseUntil)
	at := t.at(now) // after the lease's tick, which may have rebased the clock
	claim := entry{hi: k.Hi(), lo: k.Lo(), meta: pack(lease, true, tag)}
	i, d, found := t.locate(claim.hi, claim.lo)
	if found {
		e := &t.slots[i]
		r := dedup.Record{Until: int64(e.until()), Pending: e.pending(), Tag: e.tag()}
		v := dedup.Judge(r, int64(at), tag&tagMask)
		switch v.Status {
		case dedup.Proceed: // an expired commit or a lapsed claim: the claim takes the slot
			e.meta = claim.meta
		case dedup.Duplicate:
			v.Expires = time.Unix(0, t.unix(e.until()))
			if ex := t.until(extend); extend > 0 && ex > e.until() {
				e.meta = pack(ex, false, e.tag())
			}
		}
		return v, e.tag()
	}
	if t.sweep(sweepPer, t.now) || t.full() {
		// The sweep or the growth moved slots: look for the place again.
		t.grow()
		i, d, _ = t.locate(claim.hi, claim.lo)
	}
	t.shift(i, claim, d)
	return dedup.Verdict{Status: dedup.Proceed}, tag & tagMask
}

// Commit records the key as done until expires (Unix ns) by the message
// with tag, whoever held its claim. Of two commits the later expiry wins,
// so a store that reloads its commits in any order answers as before.
func (t *Table) Commit(k dedup.Key, tag uint32, expires int64) {
	exp := t.until(expires)
	done := entry{hi: k.Hi(), lo: k.Lo(), meta: pack(exp, false, tag)}
	if t.full() {
		t.grow()
	}
	i, d, found := t.locate(done.hi, done.lo)
	if !found {
		t.shift(i, done, d)
		return
	}
	if s := &t.slots[i]; s.pending() || s.until() <= exp {
		s.meta = done.meta
	}
}

// Release drops the key's claim if the message with tag holds it.
func (t *Table) Release(k dedup.Key, tag uint32) {
	if i, _, found := t.locate(k.Hi(), k.Lo()); found {
		if s := &t.slots[i]; s.pending() && s.tag() == tag&tagMask {
			t.remove(i)
		}
	}
}

// Sweep looks at up to k slots from where the last sweep stopped and
// removes the entries that ended by now (Unix ns): expired keys and claims
// whose lease lapsed (their caller gave up).
func (t *Table) Sweep(k int, now int64) {
	if t.started {
		t.sweep(min(k, len(t.slots)), t.at(now))
	}
}

// Slots is the table's size, for callers that sweep all of it.
func (t *Table) Slots() int { return len(t.slots) }

func (t *Table) home(lo uint64) int { return int(hiMul(lo, len(t.slots))) }

func (t *Table) dist(i int, e *entry) int {
	d := i - t.home(e.lo)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

func (t *Table) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

// locate walks the key's probe sequence once: it stops at the key, or at
// the slot where the key would go (with Robin Hood order a present key is
// met before it), d slots from the key's home.
func (t *Table) locate(hi, lo uint64) (i, d int, found bool) {
	i = t.home(lo)
	for ; ; d++ {
		s := &t.slots[i]
		if s.empty() || t.dist(i, s) < d {
			return i, d, false
		}
		if s.is(hi, lo) {
			return i, d, true
		}
		i = t.next(i)
	}
}

func (t *Table) full() bool { return float64(t.n+1) > maxLoad*float64(len(t.slots)) }

func (t *Table) grow() {
	if t.full() {
		t.resize(int(float64(len(t.slots))*growBy) + 1)
	}
}

// shift places e, which is d slots from its home, at slot i, moving on
// what it displaces in turn.
func (t *Table) shift(i int, e entry, d int) {
	for ; ; d++ {
		s := &t.slots[i]
		if s.empty() {
			*s = e
			t.n++
			return
		}
		if sd := t.dist(i, s); sd < d {
			e, *s = *s, e
			d = sd
		}
		i = t.next(i)
	}
}

func (t *Table) insert(e entry) { t.shift(t.home(e.lo), e, 0) }

// remove deletes slot i by shifting its followers back one step, which
// keeps probe sequences intact without tombstones.
func (t *Table) remove(i int) {
	for {
		j := t.next(i)
		s := &t.slots[j]
		if s.empty() || t.dist(j, s) == 0 {
			break
		}
		t.slots[i] = *s
		i = j
	}
	t.slots[i] = entry{}
	t.n--
}

// sweep moves the cursor k slots on, removing the entries that ended by
// the tick now. It reports whether it removed any.
func (t *Table) sweep(k int, now uint64) (removed bool) {
	for k > 0 {
		if e := &t.slots[t.cursor]; !e.empty() && e.until() <= now {
			t.remove(t.cursor) // a follower may now sit here: look again
			removed = true
			continue
		}
		t.cursor = t.next(t.cursor)
		k--
	}
	return removed
}

func (t *Table) resize(size int) {
	old := t.slots
	t.slots = make([]entry, size)
	t.n, t.cursor = 0, 0
	for i := range old {
		if !old[i].empty() {
			t.insert(old[i])
		}
	}
}

func hiMul(lo uint64, n int) uint64 {
	h, _ := bits.Mul64(lo, uint64(n))
	return h
}

// rebase shifts every expiry down by delta ticks, dropping those that end
// before it (see clock.until).
func (t *Table) rebase(delta uint64) {
	old := t.slots
	t.slots = make([]entry, len(old))
	t.n, t.cursor = 0, 0
	for _, e := range old {
		if !e.empty() && e.until() > delta {
			e.meta -= delta << expShift
			t.insert(e)
		}
	}
}
