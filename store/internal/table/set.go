package table

import (
	"sync"
	"sync/atomic"

	"github.com/dedupflow/dedupflow/dedup"
)

// Set is a table split into shards by the key's top bits, each under a
// lock of its own, for stores called from many goroutines at once.
type Set struct {
	shards []shard
	shift  uint
}

type shard struct {
	mu sync.Mutex
	t  *Table
	// now is the latest claim's now (Unix ns), written under mu and read
	// without it by Set.Now: a disk store's writer reads it for every
	// batch, and taking every shard's lock, which callers hold, made the
	// next batch wait.
	now atomic.Int64
	_   [40]byte // one cache line per shard
}

// NewSet returns a set of 1<<bits shards sized for keys keys in all. The
// shards' sizes are staggered so they grow at different moments: memory
// then rises smoothly and no single pause rehashes everything.
func NewSet(bits uint, keys int) *Set {
	s := &Set{shards: make([]shard, 1<<bits), shift: 64 - bits}
	per := keys >> bits
	for i := range s.shards {
		s.shards[i].t = New(per + i*4)
	}
	return s
}

// ShardOf is the index of the key's shard.
func (s *Set) ShardOf(k dedup.Key) int { return int(k.Hi() >> s.shift) }

// Shard is shard i's table, for filling it before the set is shared: it
// takes no lock.
func (s *Set) Shard(i int) *Table { return s.shards[i].t }

// Shards is how many shards the set has.
func (s *Set) Shards() int { return len(s.shards) }

// Claim is Table.ClaimOwner on the key's shard: the verdict, and whose
// the key is after it.
func (s *Set) Claim(k dedup.Key, tag uint32, now, leaseUntil, extend int64) (dedup.Verdict, uint32) {
	sh := &s.shards[s.ShardOf(k)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if now > sh.now.Load() {
		sh.now.Store(now)
	}
	return sh.t.ClaimOwner(k, tag, now, leaseUntil, extend)
}

// Commit is Table.Commit on the key's shard.
func (s *Set) Commit(k dedup.Key, tag uint32, expires int64) {
	sh := &s.shards[s.ShardOf(k)]
	sh.mu.Lock()
	sh.t.Commit(k, tag, expires)
	sh.mu.Unlock()
}

// Release is Table.Release on the key's shard.
func (s *Set) Release(k dedup.Key, tag uint32) {
	sh := &s.shards[s.ShardOf(k)]
	sh.mu.Lock()
	sh.t.Release(k, tag)
	sh.mu.Unlock()
}

// Sweep is Table.Sweep of up to k slots on every shard; k < 0 sweeps
// every slot.
func (s *Set) Sweep(k int, now int64) {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := k
		if n < 0 {
			n = sh.t.Slots()
		}
		sh.t.Sweep(n, now)
		sh.mu.Unlock()
	}
}

// Len is the number of keys held, pending claims and expired keys not
// swept yet included.
func (s *Set) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.t.Len()
		sh.mu.Unlock()
	}
	return n
}

// Now is the latest claim's now (Unix ns) any shard has seen, or 0.
func (s *Set) Now() int64 {
	var n int64
	for i := range s.shards {
		n = max(n, s.shards[i].now.Load())
	}
	return n
}
