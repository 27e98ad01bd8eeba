// Package storetest is the conformance suite every dedup.Store passes: each
// branch of claim / commit / release, expiry, take-over of an expired lease
// and concurrent claimants. Every case runs twice: through the single calls
// and, under Batch, through the batch calls (dedup.ClaimBatch and the
// others, a store's own when it is a dedup.BatchStore) with batches of one,
// beside cases of larger batches. Stores judge expiry by the times passed in (the
// injected clock); they may also let the server drop a key once its expiry
// has passed on the wall clock, so the suite keeps its times near now.
package storetest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// Open returns a fresh, empty store for one test.
type Open func(t *testing.T) dedup.Store

var seq atomic.Int64

// key returns a key no other test run uses, so stores backed by a shared
// server need no flushing between tests.
func key(t *testing.T) dedup.Key {
	return dedup.KeyOf(fmt.Sprintf("%s/%d/%d", t.Name(), time.Now().UnixNano(), seq.Add(1)))
}

// Run runs the suite.
func Run(t *testing.T, open Open) {
	cases := []struct {
		name string
		run  func(t *testing.T, s dedup.Store)
	}{
		{"AbsentProceeds", absentProceeds},
		{"RedeliveryAndRepublishAfterCommit", afterCommit},
		{"PendingSameMessageWaitsForLease", pendingSame},
		{"PendingOtherMessageInFlight", pendingOther},
		{"ExpiredLeaseTakenOver", expiredLease},
		{"ReleaseFreesKey", releaseFrees},
		{"ReleaseByOtherKeepsClaim", releaseByOther},
		{"CommitAfterTakeOverCounts", commitAfterTakeOver},
		{"ExpiredKeyProceeds", expiredKey},
		{"HorizonFixedFromFirstSight", horizonFixed},
		{"KeysIndependent", keysIndependent},
		{"ConcurrentClaimantsOneWins", concurrent},
		{"ReleaseAfterCommitKeepsDone", releaseAfterCommit},
		{"ClaimOverExpiredKeyHoldsLease", expiredKeyLease},
		{"DuplicateTellsExpiry", duplicateExpiry},
		{"HorizonSlidingExtendsOnDuplicate", horizonSliding},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, open(t)) })
	}
	batchCases := []struct {
		name string
		run  func(t *testing.T, s dedup.Store)
	}{
		{"Empty", batchEmpty},
		{"InOrder", batchInOrder},
		{"MixedVerdicts", batchMixed},
		{"LargerThanPipelines", batchLarge},
		{"ConcurrentBatchesOneWins", batchConcurrent},
	}
	t.Run("Batch", func(t *testing.T) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) { c.run(t, ones{open(t)}) })
		}
		for _, c := range batchCases {
			t.Run(c.name, func(t *testing.T) { c.run(t, open(t)) })
		}
	})
}

const lease = 30 * time.Second

func claim(t *testing.T, s dedup.Store, k dedup.Key, id string, now time.Time) dedup.Verdict {
	t.Helper()
	v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(lease)})
	if err != nil {
		t.Fatalf("claim %s: %v", id, err)
	}
	return v
}

func commit(t *testing.T, s dedup.Store, k dedup.Key, id string, expires time.Time) {
	t.Helper()
	if err := s.Commit(context.Background(), k, id, expires); err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
}

func release(t *testing.T, s dedup.Store, k dedup.Key, id string) {
	t.Helper()
	if err := s.Release(context.Background(), k, id); err != nil {
		t.Fatalf("release %s: %v", id, err)
	}
}

func want(t *testing.T, got dedup.Verdict, status dedup.Status, kind dedup.Kind) {
	t.Helper()
	if got.Status != status || (status == dedup.Duplicate && got.Kind != kind) {
		t.Fatalf("got %v/%v, want %v/%v", got.Status, got.Kind, status, kind)
	}
}

func absentProceeds(t *testing.T, s dedup.Store) {
	want(t, claim(t, s, key(t), "m1", time.Now()), dedup.Proceed, 0)
}

func afterCommit(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(time.Minute))
	want(t, claim(t, s, k, "m1", now.Add(time.Second)), dedup.Duplicate, dedup.Redelivery)
	want(t, claim(t, s, k, "m2", now.Add(time.Second)), dedup.Duplicate, dedup.Republish)
	// A duplicate leaves the record as it was.
	want(t, claim(t, s, k, "m1", now.Add(2*time.Second)), dedup.Duplicate, dedup.Redelivery)
}

// duplicateExpiry: a Duplicate says when its key expires, so the Deduper
// can tell how long after first sight the copy came. Stores keep expiries
// to their own resolution (the memory and disk stores to 10 ms, Redis to
// 1 ms), never earlier than committed.
func duplicateExpiry(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	expires := now.Add(time.Minute)
	commit(t, s, k, "m1", expires)
	v := claim(t, s, k, "m2", now.Add(time.Second))
	if v.Status != dedup.Duplicate || v.Expires.Before(expires.Add(-time.Millisecond)) || v.Expires.After(expires.Add(10*time.Millisecond)) {
		t.Fatalf("duplicate %+v: want Expires %v, to 10 ms", v, expires)
	}
}

// pendingSame: the same message again (redelivered to another replica
// while the first is writing it) waits; once the first's lease ends, it
// takes over.
func pendingSame(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	want(t, claim(t, s, k, "m1", now.Add(time.Second)), dedup.InFlight, 0)
	later := now.Add(lease + time.Second)
	want(t, claim(t, s, k, "m1", later), dedup.Proceed, 0)
	want(t, claim(t, s, k, "m2", later.Add(time.Second)), dedup.InFlight, 0)
}

func pendingOther(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	want(t, claim(t, s, k, "m2", now.Add(time.Second)), dedup.InFlight, 0)
}

func expiredLease(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	later := now.Add(lease + time.Second)
	want(t, claim(t, s, k, "m2", later), dedup.Proceed, 0)
	// The new holder's lease now keeps the first one out.
	want(t, claim(t, s, k, "m3", later.Add(time.Second)), dedup.InFlight, 0)
}

func releaseFrees(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	release(t, s, k, "m1")
	want(t, claim(t, s, k, "m2", now.Add(time.Second)), dedup.Proceed, 0)
}

func releaseByOther(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	release(t, s, k, "m2")
	want(t, claim(t, s, k, "m3", now.Add(time.Second)), dedup.InFlight, 0)
}

func commitAfterTakeOver(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	later := now.Add(lease + time.Second)
	want(t, claim(t, s, k, "m2", later), dedup.Proceed, 0)
	// The first holder's write reached the sink after all: its commit
	// stands, and copies are duplicates from then on.
	commit(t, s, k, "m1", now.Add(time.Hour))
	want(t, claim(t, s, k, "m4", later.Add(time.Second)), dedup.Duplicate, dedup.Republish)
}

func expiredKey(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(2*time.Second))
	want(t, claim(t, s, k, "m2", now.Add(1900*time.Millisecond)), dedup.Duplicate, dedup.Republish)
	want(t, claim(t, s, k, "m2", now.Add(2100*time.Millisecond)), dedup.Proceed, 0)
}

func horizonFixed(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(3*time.Second))
	// Duplicates seen inside the horizon do not extend it.
	for i := 0; i < 3; i++ {
		want(t, claim(t, s, k, "m2", now.Add(time.Duration(i)*time.Second)), dedup.Duplicate, dedup.Republish)
	}
	want(t, claim(t, s, k, "m2", now.Add(3100*time.Millisecond)), dedup.Proceed, 0)
}

// horizonSliding: with Claim.Extend, each caught copy keeps the key until
// Extend; an Extend earlier than the expiry leaves it; the redelivery and
// republish kinds stay as they were.
func horizonSliding(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	slide := func(id string, at time.Time) dedup.Verdict {
		t.Helper()
		v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: id, Now: at, LeaseUntil: at.Add(lease), Extend: at.Add(3 * time.Second)})
		if err != nil {
			t.Fatalf("claim %s: %v", id, err)
		}
		return v
	}
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(3*time.Second))
	// Copies 2 s apart keep the key alive well past its first 3 s.
	for i := 1; i <= 4; i++ {
		want(t, slide("m2", now.Add(time.Duration(2*i)*time.Second)), dedup.Duplicate, dedup.Republish)
	}
	want(t, slide("m1", now.Add(10*time.Second)), dedup.Duplicate, dedup.Redelivery)
	// 3 s after the last copy (at 10 s), the key is gone.
	want(t, claim(t, s, k, "m3", now.Add(13100*time.Millisecond)), dedup.Proceed, 0)
}

func keysIndependent(t *testing.T, s dedup.Store) {
	now := time.Now()
	a, b := key(t), key(t)
	want(t, claim(t, s, a, "m1", now), dedup.Proceed, 0)
	commit(t, s, a, "m1", now.Add(time.Minute))
	want(t, claim(t, s, b, "m1", now), dedup.Proceed, 0)
	release(t, s, b, "m1")
	want(t, claim(t, s, a, "m2", now), dedup.Duplicate, dedup.Republish)
}

func concurrent(t *testing.T, s dedup.Store) {
	const claimants, rounds = 8, 50
	now := time.Now()
	for r := 0; r < rounds; r++ {
		k := key(t)
		var won atomic.Int32
		var wg sync.WaitGroup
		for c := 0; c < claimants; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := s.Claim(context.Background(), dedup.Claim{
					Key: k, MsgID: fmt.Sprintf("m%d", c), Now: now, LeaseUntil: now.Add(lease)})
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if v.Status == dedup.Proceed {
					won.Add(1)
				}
			}()
		}
		wg.Wait()
		if n := won.Load(); n != 1 {
			t.Fatalf("round %d: %d claimants proceeded, want exactly 1", r, n)
		}
	}
}

// releaseAfterCommit: a late release (the writer thought the write failed)
// does not undo a commit.
func releaseAfterCommit(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(time.Minute))
	release(t, s, k, "m1")
	want(t, claim(t, s, k, "m2", now.Add(time.Second)), dedup.Duplicate, dedup.Republish)
}

// expiredKeyLease: a claim over an expired commit holds a lease like any
// other, keeping other messages out.
func expiredKeyLease(t *testing.T, s dedup.Store) {
	k, now := key(t), time.Now()
	want(t, claim(t, s, k, "m1", now), dedup.Proceed, 0)
	commit(t, s, k, "m1", now.Add(time.Second))
	want(t, claim(t, s, k, "m2", now.Add(1100*time.Millisecond)), dedup.Proceed, 0)
	want(t, claim(t, s, k, "m3", now.Add(1200*time.Millisecond)), dedup.InFlight, 0)
	want(t, claim(t, s, k, "m1", now.Add(1300*time.Millisecond)), dedup.InFlight, 0)
}
