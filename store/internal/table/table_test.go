package table

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// want is what the reference model holds for a key.
type want struct {
	exp     int64 // Unix ns
	pending bool
	tag     uint32
}

// TestTableMatchesModel runs random claims, commits, releases and partial
// sweeps against the table and a Go map; few distinct keys, so collisions,
// displacement and backward shifts all happen, through growth.
func TestTableMatchesModel(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tab := New(0)
	ref := map[dedup.Key]want{}
	key := func() dedup.Key {
		var k dedup.Key
		n := r.Uint64N(5000)
		// Seven keys share each low half (the table's hash): collisions
		// and displacement on every insert.
		binary.LittleEndian.PutUint64(k[:8], n)
		binary.LittleEndian.PutUint64(k[8:], (n%700+1)*0x9E3779B97F4A7C15)
		return k
	}
	const ms = int64(time.Millisecond)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	// verdict is the contract's answer for a claim at now by tag.
	verdict := func(w want, ok bool, now int64, tag uint32) dedup.Verdict {
		switch {
		case !ok || now >= w.exp:
			return dedup.Verdict{Status: dedup.Proceed}
		case w.pending:
			return dedup.Verdict{Status: dedup.InFlight}
		case w.tag == tag:
			return dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Redelivery, Expires: time.Unix(0, w.exp)}
		}
		return dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Republish, Expires: time.Unix(0, w.exp)}
	}
	for i := range 200000 {
		now := t0 + int64(i/25)*10*ms // whole ticks: the model needs no rounding
		k := key()
		tag := uint32(r.IntN(3) + 1)
		switch r.IntN(5) {
		case 0, 1:
			w, ok := ref[k]
			lease := now + r.Int64N(200)*10*ms
			got := tab.Claim(k, tag, now, lease, 0)
			// Retaken tells of a lapsed claim the table still holds, which
			// the model may have swept already; never of a commit.
			if got.Retaken && ok && !w.pending {
				t.Fatalf("op %d: claim = %+v over a lapsed commit, want it not retaken", i, got)
			}
			got.Retaken = false
			if exp := verdict(w, ok, now, tag); got != exp {
				t.Fatalf("op %d: claim = %+v, want %+v (held %+v, %v)", i, got, exp, w, ok)
			}
			if got.Status == dedup.Proceed {
				ref[k] = want{exp: lease, pending: true, tag: tag}
			}
		case 2: // of two commits the later expiry wins; a claim always loses
			exp := now + r.Int64N(400)*10*ms - 100*10*ms
			tab.Commit(k, tag, exp)
			if w, ok := ref[k]; !ok || w.pending || w.exp <= exp {
				ref[k] = want{exp: exp, tag: tag}
			}
		case 3:
			tab.Release(k, tag)
			if w := ref[k]; w.pending && w.tag == tag {
				delete(ref, k)
			}
		case 4:
			// A stretch is swept from where the last sweep stopped
			// (wrapping, or restarting after a resize): what it removes
			// must have ended, and nothing else may move out of reach.
			tab.Sweep(1+r.IntN(tab.Slots()/4+1), now)
			for k, w := range ref {
				if w.exp <= now {
					delete(ref, k) // ended: gone or judged absent, alike
				}
			}
		}
	}
	now := t0 + 200000/25*10*ms
	tab.Sweep(tab.Slots(), now)
	for k, w := range ref {
		if w.exp <= now {
			delete(ref, k)
		}
	}
	if tab.Len() != len(ref) {
		t.Fatalf("after a full sweep %d keys held, want %d", tab.Len(), len(ref))
	}
	for k, w := range ref {
		if got, exp := tab.Claim(k, 99, now, now+ms, 0), verdict(w, true, now, 99); got != exp {
			t.Fatalf("final: %v = %+v, want %+v", k, got, exp)
		}
	}
}

// TestClockRounding: an expiry is rounded up and a claim's now down, so a
// key is never judged expired before its time and is at most a tick late.
func TestClockRounding(t *testing.T) {
	tab := New(0)
	k := dedup.KeyOf("k")
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 3e6, time.UTC) // not on a tick
	exp := t0.Add(2 * time.Second)
	tab.Claim(k, 1, t0.UnixNano(), t0.Add(time.Second).UnixNano(), 0)
	tab.Commit(k, 1, exp.UnixNano())
	if v := tab.Claim(k, 2, exp.Add(-time.Nanosecond).UnixNano(), exp.Add(time.Minute).UnixNano(), 0); v.Status != dedup.Duplicate {
		t.Fatalf("a nanosecond before its expiry: %v, want duplicate", v.Status)
	}
	if v := tab.Claim(k, 2, exp.Add(time.Duration(tickNanos)).UnixNano(), exp.Add(time.Minute).UnixNano(), 0); v.Status != dedup.Proceed {
		t.Fatalf("a tick after its expiry: %v, want proceed", v.Status)
	}
}

// TestRebase: after years of claims the clock's base moves up; live keys
// keep their expiry and expired ones are dropped.
func TestRebase(t *testing.T) {
	tab := New(0)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	const horizon = 400 * 24 * time.Hour
	base := tab.base
	for day := 0; day < 13*366; day += 7 {
		now := t0.AddDate(0, 0, day)
		k := dedup.KeyOf(now.String())
		if v := tab.Claim(k, 1, now.UnixNano(), now.Add(time.Minute).UnixNano(), 0); v.Status != dedup.Proceed {
			t.Fatalf("day %d: new key %v", day, v.Status)
		}
		tab.Commit(k, 1, now.Add(horizon).UnixNano())
		if day >= 350 {
			old := t0.AddDate(0, 0, day-350)
			if v := tab.Claim(dedup.KeyOf(old.String()), 2, now.UnixNano(), now.Add(time.Minute).UnixNano(), 0); v.Status != dedup.Duplicate {
				t.Fatalf("day %d: the key of day %d is %v, want duplicate", day, day-350, v.Status)
			}
		}
		if day >= 406 {
			old := t0.AddDate(0, 0, day-406)
			if v := tab.Claim(dedup.KeyOf(old.String()), 2, now.UnixNano(), now.Add(time.Minute).UnixNano(), 0); v.Status != dedup.Proceed {
				t.Fatalf("day %d: the key of day %d is %v, want expired", day, day-406, v.Status)
			}
			tab.Release(dedup.KeyOf(old.String()), 2)
		}
	}
	if tab.base == base {
		t.Fatal("thirteen years passed and the clock never rebased")
	}
}
