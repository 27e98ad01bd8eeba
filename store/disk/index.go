package disk

import (
	"math/bits"

	"github.com/dedupflow/dedupflow/dedup"
)

// entry is one key in the index: 32 bytes. A committed key holds its
// expiry; a pending claim (claim set) holds the end of its lease and the
// claimant's tag, in the same slot a commit then overwrites, as in
// store/mem: claim and commit touch one table and no Go map. tag 0 marks an
// empty slot (dedup.MsgTag never returns 0).
type entry struct {
	hi, lo uint64
	exp    int64 // Unix ns: expiry, or a claim's lease end
	tag    uint32
	claim  bool // fits in the padding
}

// index is one shard's table of committed keys and pending claims, the structure of store/mem's
// table (open addressing, linear probing, Robin Hood displacement, a size
// that is not a power of two so it grows by 1.25× and stays 72–90% full)
// with full-width expiries, since they come from the file as Unix
// nanoseconds. Compared with a Go map of the same entries it needs about
// 40 rather than 67 bytes per key (measured), and no pass that marks the
// control bytes empty, which at 10M keys made loading the file twice as
// slow; expired keys are removed by the file's ordered sweep (forget).
type index struct {
	slots []entry
	n     int
}

const (
	maxLoad  = 0.9
	loadFill = 0.8 // how full a table sized for a known count starts
	growBy   = 1.25
	minSlots = 16
)

func newIndex(keys int) index {
	return index{slots: make([]entry, max(minSlots, int(float64(keys)/loadFill)+1))}
}

func (t *index) home(lo uint64) int {
	h, _ := bits.Mul64(lo, uint64(len(t.slots)))
	return int(h)
}

func (t *index) dist(i int, e *entry) int {
	d := i - t.home(e.lo)
	if d < 0 {
		d += len(t.slots)
	}
	return d
}

func (t *index) next(i int) int {
	if i++; i == len(t.slots) {
		return 0
	}
	return i
}

// find returns the slot holding the key, or -1.
func (t *index) find(k dedup.Key) int {
	hi, lo := k.Hi(), k.Lo()
	i := t.home(lo)
	for d := 0; ; d++ {
		e := &t.slots[i]
		if e.tag == 0 || t.dist(i, e) < d {
			return -1
		}
		if e.hi == hi && e.lo == lo {
			return i
		}
		i = t.next(i)
	}
}

func (t *index) get(k dedup.Key) (rec, bool) {
	if i := t.find(k); i >= 0 {
		return rec{exp: t.slots[i].exp, tag: t.slots[i].tag}, true
	}
	return rec{}, false
}

// set inserts the key or overwrites its record.
func (t *index) set(k dedup.Key, r rec) {
	if i := t.find(k); i >= 0 {
		t.slots[i] = entry{hi: k.Hi(), lo: k.Lo(), exp: r.exp, tag: r.tag}
		return
	}
	t.add(entry{hi: k.Hi(), lo: k.Lo(), exp: r.exp, tag: r.tag})
}

// setLater is set unless the key is committed with a later expiry (a
// claim is always replaced), in one probe where a find and an insert would
// make two (each a likely cache miss): with Robin Hood order a present key
// is met before the slot where an absent one would go.
func (t *index) setLater(k dedup.Key, r rec) {
	if float64(t.n+1) > maxLoad*float64(len(t.slots)) {
		t.resize(int(float64(len(t.slots))*growBy) + 1)
	}
	e := entry{hi: k.Hi(), lo: k.Lo(), exp: r.exp, tag: r.tag}
	i := t.home(e.lo)
	for d := 0; ; d++ {
		s := &t.slots[i]
		if s.tag == 0 {
			*s = e
			t.n++
			return
		}
		if s.hi == e.hi && s.lo == e.lo {
			if s.claim || s.exp <= e.exp {
				*s = e
			}
			return
		}
		if sd := t.dist(i, s); sd < d {
			e, *s = *s, e
			t.shift(t.next(i), e, sd+1)
			return
		}
		i = t.next(i)
	}
}

// add inserts a key known to be absent.
func (t *index) add(e entry) {
	if float64(t.n+1) > maxLoad*float64(len(t.slots)) {
		t.resize(int(float64(len(t.slots))*growBy) + 1)
	}
	t.insert(e)
}

func (t *index) insert(e entry) { t.shift(t.home(e.lo), e, 0) }

// shift places e, which is d slots from its home at slot i, there or
// further on, and whatever it displaces in turn.
func (t *index) shift(i int, e entry, d int) {
	for ; ; d++ {
		s := &t.slots[i]
		if s.tag == 0 {
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
func (t *index) remove(i int) {
	for {
		j := t.next(i)
		s := &t.slots[j]
		if s.tag == 0 || t.dist(j, s) == 0 {
			break
		}
		t.slots[i] = *s
		i = j
	}
	t.slots[i] = entry{}
	t.n--
}

// dropExpired looks at up to k slots from cursor on and removes the
// entries that ended by now: lapsed claims (their caller gave up) and
// expired keys the ordered sweep has not reached (a key committed already
// expired). It returns where to go on next time.
func (t *index) dropExpired(cursor, k int, now int64) int {
	if cursor >= len(t.slots) {
		cursor = 0 // the table was resized
	}
	for ; k > 0; k-- {
		if e := &t.slots[cursor]; e.tag != 0 && e.exp <= now {
			t.remove(cursor) // a follower may now sit here: look again
			continue
		}
		cursor = t.next(cursor)
	}
	return cursor
}

func (t *index) resize(size int) {
	old := t.slots
	t.slots = make([]entry, size)
	t.n = 0
	for i := range old {
		if old[i].tag != 0 {
			t.insert(old[i])
		}
	}
}
