// Package mem is the in-memory dedup store: the default, fastest, and
// forgotten on restart. Committed keys cost about 30 bytes each (a 128-bit
// hash, a 32-bit expiry and a 32-bit message-ID tag in a dense table);
// pending claims, which are few, live in a plain map beside it.
package mem

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// MaxHorizon is the longest horizon this store accepts; ticks are 32 bits
// of 10 ms and the store rebases them long before they run out.
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
	mu      sync.Mutex
	t       *table
	pending map[dedup.Key]pending
	base    int64  // Unix nanoseconds of tick 0; 0 until first use
	now     uint32 // latest tick seen, for the sweep
	_       [24]byte
}

type pending struct {
	msgID string
	until time.Time
}

var _ dedup.Store = (*Store)(nil)

// New returns an empty store.
func New() *Store {
	s := &Store{}
	for i := range s.shards {
		// Stagger the shards' sizes so they grow at different moments:
		// memory then rises smoothly and no single pause rehashes everything.
		s.shards[i].t = newTable(minSlots + i*4)
		s.shards[i].pending = make(map[dedup.Key]pending)
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
	if ticks >= math.MaxUint32 {
		delta := uint32((n - baseSlack - sh.base) / tickNanos)
		sh.t.rebase(delta)
		sh.base += int64(delta) * tickNanos
		sh.now = 0
		ticks = (n - sh.base + tickNanos - 1) / tickNanos
	}
	return uint32(ticks)
}

// Claim implements dedup.Store.
func (s *Store) Claim(_ context.Context, c dedup.Claim) (dedup.Verdict, error) {
	hi, lo := c.Key.Hi(), c.Key.Lo()
	sh := s.shard(c.Key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := sh.tick(c.Now)
	if now > sh.now {
		sh.now = now
	}
	if i := sh.t.find(hi, lo); i >= 0 && sh.t.slots[i].exp > now {
		kind := dedup.Republish
		if sh.t.slots[i].tag == dedup.MsgTag(c.MsgID) {
			kind = dedup.Redelivery
		}
		return dedup.Verdict{Status: dedup.Duplicate, Kind: kind}, nil
	}
	if p, ok := sh.pending[c.Key]; ok {
		if p.msgID != c.MsgID && c.Now.Before(p.until) {
			return dedup.Verdict{Status: dedup.InFlight}, nil
		}
		sh.pending[c.Key] = pending{msgID: c.MsgID, until: c.LeaseUntil}
		return dedup.Verdict{Status: dedup.Proceed}, nil
	}
	sh.pending[c.Key] = pending{msgID: c.MsgID, until: c.LeaseUntil}
	return dedup.Verdict{Status: dedup.Proceed}, nil
}

// Commit implements dedup.Store.
func (s *Store) Commit(_ context.Context, k dedup.Key, msgID string, expires time.Time) error {
	tag := dedup.MsgTag(msgID)
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	exp := sh.tick(expires)
	delete(sh.pending, k) // done now, whoever held the lease
	sh.t.put(k.Hi(), k.Lo(), exp, tag, sh.now)
	return nil
}

// Release implements dedup.Store.
func (s *Store) Release(_ context.Context, k dedup.Key, msgID string) error {
	sh := s.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p, ok := sh.pending[k]; ok && p.msgID == msgID {
		delete(sh.pending, k)
	}
	return nil
}

// Len is the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.n + len(sh.pending)
		sh.mu.Unlock()
	}
	return n
}
