package storetest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// ones makes each single call of the cases a batch of one, so that every
// case also runs through the batch calls.
type ones struct{ s dedup.Store }

func (o ones) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	vs, errs := make([]dedup.Verdict, 1), make([]error, 1)
	dedup.ClaimBatch(ctx, o.s, []dedup.Claim{c}, vs, errs)
	return vs[0], errs[0]
}

func (o ones) Commit(ctx context.Context, k dedup.Key, msgID string, expires time.Time) error {
	errs := make([]error, 1)
	dedup.CommitBatch(ctx, o.s, []dedup.Entry{{Key: k, MsgID: msgID, Expires: expires}}, errs)
	return errs[0]
}

func (o ones) Release(ctx context.Context, k dedup.Key, msgID string) error {
	errs := make([]error, 1)
	dedup.ReleaseBatch(ctx, o.s, []dedup.Entry{{Key: k, MsgID: msgID}}, errs)
	return errs[0]
}

func claims(t *testing.T, s dedup.Store, cs ...dedup.Claim) []dedup.Verdict {
	t.Helper()
	vs, errs := make([]dedup.Verdict, len(cs)), make([]error, len(cs))
	dedup.ClaimBatch(context.Background(), s, cs, vs, errs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("claim %d of %d (%s): %v", i, len(cs), cs[i].MsgID, err)
		}
	}
	return vs
}

func commits(t *testing.T, s dedup.Store, es ...dedup.Entry) {
	t.Helper()
	errs := make([]error, len(es))
	dedup.CommitBatch(context.Background(), s, es, errs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("commit %d of %d (%s): %v", i, len(es), es[i].MsgID, err)
		}
	}
}

func releases(t *testing.T, s dedup.Store, es ...dedup.Entry) {
	t.Helper()
	errs := make([]error, len(es))
	dedup.ReleaseBatch(context.Background(), s, es, errs)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("release %d of %d (%s): %v", i, len(es), es[i].MsgID, err)
		}
	}
}

func at(k dedup.Key, id string, now time.Time) dedup.Claim {
	return dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(lease)}
}

func wants(t *testing.T, got []dedup.Verdict, want ...dedup.Verdict) {
	t.Helper()
	for i := range want {
		if got[i].Status != want[i].Status || got[i].Kind != want[i].Kind {
			t.Fatalf("item %d: got %v/%v, want %v/%v", i, got[i].Status, got[i].Kind, want[i].Status, want[i].Kind)
		}
	}
}

var (
	proceed    = dedup.Verdict{Status: dedup.Proceed}
	inFlight   = dedup.Verdict{Status: dedup.InFlight}
	redelivery = dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Redelivery}
	republish  = dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Republish}
)

// batchEmpty: empty batches are answered, as no calls at all.
func batchEmpty(t *testing.T, s dedup.Store) {
	claims(t, s)
	commits(t, s)
	releases(t, s)
}

// batchInOrder: a batch is its items' calls one after another: a key
// claimed again later in the same batch is in flight, even by the same
// message, as a second claim would be.
func batchInOrder(t *testing.T, s dedup.Store) {
	a, b, now := key(t), key(t), time.Now()
	wants(t, claims(t, s, at(a, "m1", now), at(a, "m2", now), at(b, "m1", now), at(a, "m1", now)),
		proceed, inFlight, proceed, inFlight)
	commits(t, s, dedup.Entry{Key: a, MsgID: "m1", Expires: now.Add(time.Minute)},
		dedup.Entry{Key: b, MsgID: "m1", Expires: now.Add(time.Minute)})
	later := now.Add(time.Second)
	wants(t, claims(t, s, at(a, "m1", later), at(a, "m3", later), at(b, "m3", later)), redelivery, republish, republish)
}

// batchMixed: each item gets its own verdict, whatever the others'; a
// batch release frees only the keys its messages hold.
func batchMixed(t *testing.T, s dedup.Store) {
	done, held, free, expired, now := key(t), key(t), key(t), key(t), time.Now()
	wants(t, claims(t, s, at(done, "d1", now), at(held, "h1", now), at(expired, "e1", now)), proceed, proceed, proceed)
	commits(t, s, dedup.Entry{Key: done, MsgID: "d1", Expires: now.Add(time.Minute)},
		dedup.Entry{Key: expired, MsgID: "e1", Expires: now.Add(time.Second)})
	later := now.Add(2 * time.Second)
	wants(t, claims(t, s, at(done, "x", later), at(held, "x", later), at(free, "x", later), at(expired, "x", later)),
		republish, inFlight, proceed, proceed)
	// x releases the two keys it holds; its release of held (h1's) and of
	// done (committed) change nothing.
	releases(t, s, dedup.Entry{Key: free, MsgID: "x"}, dedup.Entry{Key: held, MsgID: "x"},
		dedup.Entry{Key: expired, MsgID: "x"}, dedup.Entry{Key: done, MsgID: "x"})
	wants(t, claims(t, s, at(done, "y", later), at(held, "y", later), at(free, "y", later), at(expired, "y", later)),
		republish, inFlight, proceed, proceed)
}

// batchLarge: a batch larger than a store's own pipelines or groups (a
// StreamingPull response can bring a thousand messages) is answered whole.
func batchLarge(t *testing.T, s dedup.Store) {
	const n = 1200
	now := time.Now()
	cs := make([]dedup.Claim, n)
	es := make([]dedup.Entry, n)
	for i := range cs {
		id := fmt.Sprintf("m%d", i)
		cs[i] = at(key(t), id, now)
		es[i] = dedup.Entry{Key: cs[i].Key, MsgID: id, Expires: now.Add(time.Minute)}
	}
	for _, v := range claims(t, s, cs...) {
		wants(t, []dedup.Verdict{v}, proceed)
	}
	commits(t, s, es...)
	for i := range cs {
		cs[i].Now, cs[i].LeaseUntil = now.Add(time.Second), now.Add(time.Second+lease)
	}
	for _, v := range claims(t, s, cs...) {
		wants(t, []dedup.Verdict{v}, redelivery)
	}
}

// batchConcurrent: batches from several goroutines over the same keys, in
// different orders: each key is won by exactly one message.
func batchConcurrent(t *testing.T, s dedup.Store) {
	const claimants, keys = 8, 50
	now := time.Now()
	ks := make([]dedup.Key, keys)
	for i := range ks {
		ks[i] = key(t)
	}
	won := make([][]dedup.Verdict, claimants)
	var wg sync.WaitGroup
	for c := range claimants {
		wg.Go(func() {
			order := rand.Perm(keys)
			cs := make([]dedup.Claim, keys)
			for i := range cs {
				cs[i] = at(ks[order[i]], fmt.Sprintf("m%d", c), now)
			}
			vs, errs := make([]dedup.Verdict, keys), make([]error, keys)
			dedup.ClaimBatch(context.Background(), s, cs, vs, errs)
			for i, err := range errs {
				if err != nil {
					t.Errorf("claimant %d, item %d: %v", c, i, err)
				}
			}
			byKey := make([]dedup.Verdict, keys)
			for i := range cs {
				byKey[order[i]] = vs[i]
			}
			won[c] = byKey
		})
	}
	wg.Wait()
	for k := range keys {
		n := 0
		for c := range claimants {
			if won[c][k].Status == dedup.Proceed {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("key %d: %d claimants proceeded, want exactly 1", k, n)
		}
	}
}
