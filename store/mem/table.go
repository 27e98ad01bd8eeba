package mem

import "math/bits"

// entry is one key: 24 bytes, so ten million keys fit in about 300 MB.
// exp holds the expiry in ticks (see shard.tick) in its low 31 bits and,
// in its top bit, whether the key is only claimed (pending, exp is then
// the lease's end) rather than committed; 0 marks an empty slot. tag is the
// message-ID tag of the claimant or committer.
type entry struct {
	hi, lo uint64
	exp    uint32
	tag    uint32
}

const (
	pendingBit = 1 << 31
	tickMask   = pendingBit - 1
)

func (e *entry) until() uint32        { return e.exp & tickMask }
func (e *entry) pending() bool        { return e.exp&pendingBit != 0 }
func (e *entry) live(now uint32) bool { return e.until() > now }

// table is an open-addressing hash table with linear probing and Robin Hood
// displacement. Its size is not a power of two (the slot is picked with a
// multiply-shift), so it can grow by 1.25× and stay between 72% and 90%
// full; that is what keeps memory per live key near 24/0.8 bytes where a Go
// map of the same entries doubles and sits half empty after each growth.
// Expired entries are removed by a cursor that sweeps a few slots on every
// insert, so memory follows live keys without ever scanning the whole table
// at once.
type table struct {
	slots []entry
	n     int // occupied slots, expired ones included until swept
	sweep int // next slot the cursor looks at
}

const (
	maxLoad  = 0.9
	growBy   = 1.25
	minSlots = 64
	sweepPer = 8 // slots swept per insert: expired keys linger for under a tenth of the live count
)

func newTable(size int) *table {
	if size < minSlots {
		size = minSlots
	}
	return &table{slots: make([]entry, size)}
}

func (t *table) home(lo uint64) int {
	h, _ := bits.Mul64(lo, uint64(len(t.slots)))
	return int(h)
}

func (t *table) dist(i int, e *entry) int {
	d := i - t.home(e.lo)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

func (t *table) next(i int) int {
	i++
	if i == len(t.slots) {
		return 0
	}
	return i
}

// find returns the slot holding the key, or -1.
func (t *table) find(hi, lo uint64) int {
	i := t.home(lo)
	for d := 0; ; d++ {
		e := &t.slots[i]
		if e.exp == 0 || t.dist(i, e) < d {
			return -1
		}
		if e.hi == hi && e.lo == lo {
			return i
		}
		i = t.next(i)
	}
}

// add inserts a key that find did not find. now is the current tick, for
// the sweep.
func (t *table) add(hi, lo uint64, exp, tag uint32, now uint32) {
	t.sweepSome(now, sweepPer)
	if float64(t.n+1) > maxLoad*float64(len(t.slots)) {
		t.resize(int(float64(len(t.slots))*growBy) + 1)
	}
	t.insert(entry{hi: hi, lo: lo, exp: exp, tag: tag})
}

func (t *table) insert(e entry) {
	i := t.home(e.lo)
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.exp == 0 {
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

// remove deletes slot i by shifting its followers back one step, which
// keeps probe sequences intact without tombstones.
func (t *table) remove(i int) {
	for {
		j := t.next(i)
		s := &t.slots[j]
		if s.exp == 0 || t.dist(j, s) == 0 {
			break
		}
		t.slots[i] = *s
		i = j
	}
	t.slots[i] = entry{}
	t.n--
}

// sweepSome looks at k slots from the cursor and removes expired entries.
func (t *table) sweepSome(now uint32, k int) {
	for ; k > 0; k-- {
		i := t.sweep
		if e := &t.slots[i]; e.exp != 0 && e.until() <= now {
			t.remove(i) // a follower may now sit at i: look again next time
			continue
		}
		t.sweep = t.next(i)
	}
}

func (t *table) resize(size int) {
	old := t.slots
	t.slots = make([]entry, size)
	t.n = 0
	t.sweep = 0
	for i := range old {
		if old[i].exp != 0 {
			t.insert(old[i])
		}
	}
}

// rebase shifts every expiry down by delta ticks, dropping those that end
// before it. It runs once in about a year of uptime.
func (t *table) rebase(delta uint32) {
	old := t.slots
	t.slots = make([]entry, len(old))
	t.n, t.sweep = 0, 0
	for _, e := range old {
		if e.until() > delta {
			e.exp -= delta
			t.insert(e)
		}
	}
}
