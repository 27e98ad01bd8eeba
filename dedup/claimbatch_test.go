package dedup_test

import (
	"context"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// TestDeduperClaimBatch: a key claimed twice in one batch, or held by this
// process for another message, is marked Here without asking the store
// or waiting; a Claim waiting for a key the batch holds is woken when the
// batch commits it, and finds a duplicate.
func TestDeduperClaimBatch(t *testing.T) {
	ctx := context.Background()
	d, err := dedup.New(mem.New(), dedup.Options{LocalWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	a, b, held := dedup.KeyOf("a"), dedup.KeyOf("b"), dedup.KeyOf("held")
	_, heldTicket, err := d.Claim(ctx, held, "h1", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	bs := []dedup.BatchClaim{{Key: a, MsgID: "1"}, {Key: b, MsgID: "2"}, {Key: a, MsgID: "3"}, {Key: held, MsgID: "4"}}
	start := time.Now()
	d.ClaimBatch(ctx, bs)
	if took := time.Since(start); took > time.Second {
		t.Errorf("the batch claim took %v: it waited for a local write", took)
	}
	for i, want := range []struct {
		status dedup.Status
		here   bool
	}{{dedup.Proceed, false}, {dedup.Proceed, false}, {dedup.InFlight, true}, {dedup.InFlight, true}} {
		if bs[i].Err != nil || bs[i].Verdict.Status != want.status || bs[i].Here != want.here {
			t.Fatalf("claim %d: %v here=%v, %v; want %v here=%v", i, bs[i].Verdict.Status, bs[i].Here, bs[i].Err, want.status, want.here)
		}
	}
	// A copy of a, passed alone, waits for the batch's write of a.
	copied := make(chan dedup.Verdict)
	go func() {
		v, _, _ := d.Claim(ctx, a, "5", time.Time{})
		copied <- v
	}()
	errs := make([]error, 2)
	d.CommitBatch(ctx, []dedup.Ticket{bs[0].Ticket, bs[1].Ticket}, errs)
	if errs[0] != nil || errs[1] != nil {
		t.Fatal(errs)
	}
	select {
	case v := <-copied:
		if v.Status != dedup.Duplicate || v.Kind != dedup.Republish {
			t.Fatalf("the copy after the batch's commit: %v/%v, want duplicate/republish", v.Status, v.Kind)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the copy was not woken by the batch's commit")
	}
	// Released keys are free at once.
	errs = errs[:1]
	d.ReleaseBatch(ctx, []dedup.Ticket{heldTicket}, errs)
	bs = []dedup.BatchClaim{{Key: held, MsgID: "4"}, {Key: b, MsgID: "2"}}
	d.ClaimBatch(ctx, bs)
	if bs[0].Verdict.Status != dedup.Proceed || bs[1].Verdict.Status != dedup.Duplicate || bs[1].Verdict.Kind != dedup.Redelivery {
		t.Fatalf("after release and commit: %v, %v/%v", bs[0].Verdict.Status, bs[1].Verdict.Status, bs[1].Verdict.Kind)
	}
}

// calls is a batch store that counts its single and batch claims.
type calls struct {
	*mem.Store
	single, batch int
}

func (c *calls) Claim(ctx context.Context, cl dedup.Claim) (dedup.Verdict, error) {
	c.single++
	return c.Store.Claim(ctx, cl)
}

func (c *calls) ClaimBatch(ctx context.Context, cs []dedup.Claim, vs []dedup.Verdict, errs []error) {
	c.batch++
	c.Store.ClaimBatch(ctx, cs, vs, errs)
}

// TestClaimBatchOfOneIsClaim: a batch of one claim is a Claim, which a
// store gathers with the claims that arrive beside it (the Redis store's
// pipeline); two or more go in one batch call.
func TestClaimBatchOfOneIsClaim(t *testing.T) {
	s := &calls{Store: mem.New()}
	now := time.Now()
	claim := func(k string) dedup.Claim {
		return dedup.Claim{Key: dedup.KeyOf(k), MsgID: k, Now: now, LeaseUntil: now.Add(time.Minute)}
	}
	vs, errs := make([]dedup.Verdict, 2), make([]error, 2)
	dedup.ClaimBatch(context.Background(), s, []dedup.Claim{claim("a")}, vs[:1], errs[:1])
	if s.single != 1 || s.batch != 0 {
		t.Fatalf("one claim: %d single and %d batch calls, want one single", s.single, s.batch)
	}
	dedup.ClaimBatch(context.Background(), s, []dedup.Claim{claim("b"), claim("c")}, vs, errs)
	if s.single != 1 || s.batch != 1 {
		t.Fatalf("two claims: %d single and %d batch calls, want one batch", s.single-1, s.batch)
	}
}
