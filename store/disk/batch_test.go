package disk

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// TestCommitBatchOneGroup: a batch commit is one group (one Pebble batch,
// one fsync) however many keys it carries, and survives a reopen; so do the
// sliding extensions of a batch claim's duplicates, with their first
// message as owner.
func TestCommitBatchOneGroup(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	ctx, now := context.Background(), time.Now()
	s, err := Open(ctx, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 700
	cs := make([]dedup.Claim, n)
	es := make([]dedup.Entry, n)
	for i := range cs {
		k, id := dedup.KeyOf(fmt.Sprint("batch", i)), fmt.Sprint("m", i)
		cs[i] = dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(30 * time.Second)}
		es[i] = dedup.Entry{Key: k, MsgID: id, Expires: now.Add(time.Minute)}
	}
	vs, errs := make([]dedup.Verdict, n), make([]error, n)
	s.ClaimBatch(ctx, cs, vs, errs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	txs := s.w.txs.Load()
	s.CommitBatch(ctx, es, errs)
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if got := s.w.txs.Load() - txs; got != 1 {
		t.Errorf("a batch commit of %d keys took %d writes, want 1", n, got)
	}
	// Copies of the first two keys, on the sliding horizon: both extended
	// in one more group.
	at := now.Add(time.Second)
	copies := []dedup.Claim{
		{Key: cs[0].Key, MsgID: "copy", Now: at, LeaseUntil: at.Add(30 * time.Second), Extend: at.Add(2 * time.Minute)},
		{Key: cs[1].Key, MsgID: "copy", Now: at, LeaseUntil: at.Add(30 * time.Second), Extend: at.Add(2 * time.Minute)},
	}
	txs = s.w.txs.Load()
	s.ClaimBatch(ctx, copies, vs[:2], errs[:2])
	if err := errors.Join(errs[:2]...); err != nil || vs[0].Kind != dedup.Republish || vs[1].Kind != dedup.Republish {
		t.Fatalf("copies extending their keys: %v/%v, %v", vs[0].Kind, vs[1].Kind, err)
	}
	if got := s.w.txs.Load() - txs; got != 1 {
		t.Errorf("two extensions in a batch claim took %d writes, want 1", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	later := now.Add(90 * time.Second) // past the first expiry: only the extended keys live
	for i, want := range []dedup.Status{dedup.Duplicate, dedup.Duplicate, dedup.Proceed} {
		v := claim(t, s, cs[i].Key, cs[i].MsgID, later)
		if v.Status != want || (want == dedup.Duplicate && v.Kind != dedup.Redelivery) {
			t.Errorf("key %d after reopen, 90 s on: %v/%v, want %v (a redelivery of its first message)", i, v.Status, v.Kind, want)
		}
	}
	if v := claim(t, s, cs[n-1].Key, "other", now.Add(30*time.Second)); v.Status != dedup.Duplicate {
		t.Errorf("the batch's last key after reopen: %v, want duplicate", v.Status)
	}
}
