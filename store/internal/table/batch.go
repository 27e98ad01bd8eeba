package table

import (
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// first is the index list of a batch of one; fn only reads it.
var first = []int32{0}

// byShard calls fn once for every shard that holds any of the n keys, under
// that shard's lock, with the indices of its keys in their order: a batch
// takes each lock once instead of once per key, and a key's items (all in
// one shard) keep their order.
func (s *Set) byShard(n int, key func(i int) dedup.Key, fn func(t *Table, sh *shard, idx []int32)) {
	if n == 0 {
		return
	}
	if n == 1 {
		sh := &s.shards[s.ShardOf(key(0))]
		sh.mu.Lock()
		fn(sh.t, sh, first)
		sh.mu.Unlock()
		return
	}
	of := make([]int32, n)
	start := make([]int32, len(s.shards)+1)
	for i := range n {
		sh := int32(s.ShardOf(key(i)))
		of[i] = sh
		start[sh+1]++
	}
	for i := 1; i < len(start); i++ {
		start[i] += start[i-1]
	}
	order := make([]int32, n)
	next := make([]int32, len(s.shards))
	copy(next, start)
	for i, sh := range of {
		order[next[sh]] = int32(i)
		next[sh]++
	}
	// Batches from other goroutines walk the shards from where their own
	// first key is, not all from shard 0: in step, they would queue on
	// each lock in turn.
	from := int(of[0])
	for j := range s.shards {
		i := (from + j) % len(s.shards)
		if start[i] == start[i+1] {
			continue
		}
		sh := &s.shards[i]
		sh.mu.Lock()
		fn(sh.t, sh, order[start[i]:start[i+1]])
		sh.mu.Unlock()
	}
}

// ClaimBatch is Claim of every cs[i] into vs[i] and, unless owners is nil,
// owners[i], taking each shard's lock once.
func (s *Set) ClaimBatch(cs []dedup.Claim, vs []dedup.Verdict, owners []uint32) {
	s.byShard(len(cs), func(i int) dedup.Key { return cs[i].Key }, func(t *Table, sh *shard, idx []int32) {
		for _, i := range idx {
			c := &cs[i]
			now := c.Now.UnixNano()
			if now > sh.now.Load() {
				sh.now.Store(now)
			}
			v, owner := t.ClaimOwner(c.Key, dedup.MsgTag(c.MsgID), now, c.LeaseUntil.UnixNano(), UnixNano(c.Extend))
			vs[i] = v
			if owners != nil {
				owners[i] = owner
			}
		}
	})
}

// CommitBatch is Commit of every es[i], taking each shard's lock once.
func (s *Set) CommitBatch(es []dedup.Entry) {
	s.byShard(len(es), func(i int) dedup.Key { return es[i].Key }, func(t *Table, _ *shard, idx []int32) {
		for _, i := range idx {
			t.Commit(es[i].Key, dedup.MsgTag(es[i].MsgID), es[i].Expires.UnixNano())
		}
	})
}

// ReleaseBatch is Release of every es[i], taking each shard's lock once.
func (s *Set) ReleaseBatch(es []dedup.Entry) {
	s.byShard(len(es), func(i int) dedup.Key { return es[i].Key }, func(t *Table, _ *shard, idx []int32) {
		for _, i := range idx {
			t.Release(es[i].Key, dedup.MsgTag(es[i].MsgID))
		}
	})
}

// UnixNano is t in Unix ns, 0 for the zero time (no sliding extension).
func UnixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}
