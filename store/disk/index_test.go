package disk

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/dedupflow/dedupflow/dedup"
)

// TestIndexMatchesMap runs random sets, gets, removes and partial walks
// for expired entries against the index and a Go map; few distinct keys, so collisions, displacement and
// backward shifts all happen, through growth.
func TestIndexMatchesMap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	ix := newIndex(0)
	ref := map[dedup.Key]rec{}
	key := func() dedup.Key {
		var k dedup.Key
		n := r.Uint64N(5000)
		// Seven keys share each low half (the table's hash): collisions
		// and displacement on every insert.
		binary.LittleEndian.PutUint64(k[:8], n)
		binary.LittleEndian.PutUint64(k[8:], (n%700+1)*0x9E3779B97F4A7C15)
		return k
	}
	cursor := 0
	for i := range 200000 {
		k := key()
		if i%200 == 199 {
			// A stretch of the table is walked from where the last walk
			// stopped (wrapping at its end, or restarting after a
			// resize): what it removes must have expired, and nothing
			// else may move out of reach.
			now := int64(i) - 100000
			cursor = ix.dropExpired(cursor, 1+r.IntN(len(ix.slots)/4+1), now)
			for k, want := range ref {
				got, ok := ix.get(k)
				if !ok && want.exp <= now {
					delete(ref, k)
					continue
				}
				if !ok || got != want {
					t.Fatalf("op %d, after a walk to slot %d at %d: %v = %v,%v; want %v", i, cursor, now, k, got, ok, want)
				}
			}
		}
		switch r.IntN(4) {
		case 0:
			v := rec{exp: int64(i), tag: uint32(i%7 + 1)}
			ix.set(k, v)
			ref[k] = v
		case 2: // an earlier expiry than the one held is ignored
			v := rec{exp: r.Int64N(200000), tag: uint32(i%5 + 1)}
			ix.setLater(k, v)
			if old, ok := ref[k]; !ok || old.exp <= v.exp {
				ref[k] = v
			}
		case 1:
			if j := ix.find(k); j >= 0 {
				ix.remove(j)
			}
			delete(ref, k)
		}
		got, ok := ix.get(k)
		want, wok := ref[k]
		if ok != wok || got != want {
			t.Fatalf("op %d: get %v = %v,%v; want %v,%v", i, k, got, ok, want, wok)
		}
		if ix.n != len(ref) {
			t.Fatalf("op %d: n = %d, want %d", i, ix.n, len(ref))
		}
	}
	for k, want := range ref {
		if got, ok := ix.get(k); !ok || got != want {
			t.Fatalf("final: %v = %v,%v; want %v", k, got, ok, want)
		}
	}
}
