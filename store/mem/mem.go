// Package mem is the in-memory dedup store: the default, fastest, and
// forgotten on restart. A key costs about 30 bytes (a 128-bit hash, a
// 32-bit expiry and a 32-bit message-ID tag in a dense table), claimed or
// committed alike: a claim is the same slot with a flag, so claim and
// commit touch one table and nothing else.
package mem

import (
	"context"
	"sync"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// MaxHorizon is the longest horizon this store accepts; ticks are 31 bits
// of 10 ms (248 days) and the store rebases them before they run out.
const MaxHorizon = 90 * 24 * time.Hour

const (
	shardBits = 6
	tickNanos = int64(10 * time.Millisecond)
	// Ticks start a day before the first time seen, so clocks that step
	// back a little still land on positive ticks.
	baseSlack = int64(24 * time.Hour)
)

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	shards [1 << shardBits]shard
}

type shard struct {
	mu   sync.Mutex
	t    *table
	base int64  // Unix nanoseconds of tick 0; 0 until first use
	now  uint32 // latest tick seen, for the sweep
	_    [32]byte
}

var _ dedup.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	s := &Store{}
	for i := range s.shards {
		// Stagger the shards' sizes so they grow at different moments:
		// memory then rises smoothly and no single pause rehashes everything.
		s.shards[i].t = newTable(minSlots + i*4)
	}
	return s
}

func (s *Store) shard(k dedup.Key) *shard { return &s.shards[k.Hi()>>(64-shardBits)] }

// tick converts a time to ticks, rounding up so a key never expires early.
// Each shard has its own base, so the conversion needs no lock but the
// shard's.
func (sh *shard) tick(t time.Time) uint32 {
	n := t.UnixNano()
	if sh.base == 0 {
		sh.base = n - baseSlack
	}
	d := n - sh.base
	if d <= 0 {
		return 1
	}
	ticks := (d + tickNanos - 1) / tickNanos
	if ticks > tickMask && sh.now > uint32(baseSlack/tickNanos) {
		// Move tick 0 up to a day before the latest time seen (never past
		// it: live keys must keep their place), once in months.
		delta := sh.now - uint32(baseSlack/tickNanos)
		sh.t.rebase(delta)
		sh.base += int64(delta) * tickNanos
		sh.now -= delta
		ticks = (n - sh.base + tickNanos - 1) / tickNanos
	}
	// A time still out of range (an expiry far in the future) is held at
	// the last tick: the key lives as long as the store can tell.
	return uint32(min(ticks, tickMask))
}

// Claim implements dedup.Store.
func (s *Store) Claim(_ context.Context, c dedup.Claim) (dedup.Verdict, error) {
	hi, lo := c.Key.Hi(), c.Key.Lo()
	tag := dedup.MsgTag(c.MsgID)
	sh := s.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.tick(c.Now)
	if now > sh.now {
		sh.now = now
	}
	lease := sh.tick(c.LeaseUntil) | pendingBit
	now = sh.tick(c.Now) // the lease's tick may have rebased the shard
	i := sh.t.find(hi, lo)
	if i < 0 {
		sh.t.add(hi, lo, lease, tag, sh.now)
		return dedup.Verdict{Status: dedup.Proceed}, nil
	}
	e := &sh.t.slots[i]
	switch {
	case !e.live(now): // expired commit or abandoned claim
	case !e.pending():
		kind := dedup.Republish
		if e.tag == tag {
			kind = dedup.Redelivery
		}
		return dedup.Verdict{Status: dedup.Duplicate, Kind: kind}, nil
	default: // a live claim, whoever holds it
		return dedup.Verdict{Status: dedup.InFlight}, nil
	}
	e.exp, e.tag = lease, tag
	return dedup.Verdict{Status: dedup.Proceed}, nil
}

// Commit implements dedup.Store.
func (s *Store) Commit(_ context.Context, k dedup.Key, msgID string, expires time.Time) error {
	hi, lo := k.Hi(), k.Lo()
	tag := dedup.MsgTag(msgID)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	exp := sh.tick(expires)
	if i := sh.t.find(hi, lo); i >= 0 {
		// Done now, whoever held the claim.
		sh.t.slots[i].exp, sh.t.slots[i].tag = exp, tag
		return nil
	}
	sh.t.add(hi, lo, exp, tag, sh.now)
	return nil
}

// Release implements dedup.Store.
func (s *Store) Release(_ context.Context, k dedup.Key, msgID string) error {
	tag := dedup.MsgTag(msgID)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := sh.t.find(k.Hi(), k.Lo()); i >= 0 && sh.t.slots[i].pending() && sh.t.slots[i].tag == tag {
		sh.t.remove(i)
	}
	return nil
}

// Len is the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n
		sh.mu.Unlock()
	}
	return n
}
