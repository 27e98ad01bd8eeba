package redis

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestBatchScriptsAndDown: the batch calls take the claim and release
// scripts' path when the server forgot them (a restart), and when the
// server is gone every item of a batch fails as unavailable, at once.
func TestBatchScriptsAndDown(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := open(t, srv.URL(), Options{Timeout: time.Second})
	ctx, now := context.Background(), time.Now()
	expired, held := dedup.KeyOf("expired"), dedup.KeyOf("held")
	claimAll := func(at time.Time, cs ...dedup.Claim) ([]dedup.Verdict, []error) {
		vs, errs := make([]dedup.Verdict, len(cs)), make([]error, len(cs))
		for i := range cs {
			cs[i].Now, cs[i].LeaseUntil = at, at.Add(time.Minute)
		}
		s.ClaimBatch(ctx, cs, vs, errs)
		return vs, errs
	}
	if _, errs := claimAll(now, dedup.Claim{Key: expired, MsgID: "m1"}, dedup.Claim{Key: held, MsgID: "m1"}); errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	errs := make([]error, 1)
	s.CommitBatch(ctx, []dedup.Entry{{Key: expired, MsgID: "m1", Expires: now.Add(time.Second)}}, errs)
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Over an expired commit: the claim script, sent again by EVAL.
	vs, errs := claimAll(now.Add(2*time.Second), dedup.Claim{Key: expired, MsgID: "m2"}, dedup.Claim{Key: held, MsgID: "m2"})
	if errors.Join(errs...) != nil || vs[0].Status != dedup.Proceed || vs[1].Status != dedup.InFlight {
		t.Fatalf("after the scripts were flushed: %v %v, %v; want proceed, in flight", vs[0].Status, vs[1].Status, errs)
	}
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	errs = make([]error, 2)
	s.ReleaseBatch(ctx, []dedup.Entry{{Key: expired, MsgID: "m2"}, {Key: held, MsgID: "m1"}}, errs)
	if errors.Join(errs...) != nil {
		t.Fatal(errs)
	}
	vs, errs = claimAll(now.Add(3*time.Second), dedup.Claim{Key: expired, MsgID: "m3"}, dedup.Claim{Key: held, MsgID: "m3"})
	if errors.Join(errs...) != nil || vs[0].Status != dedup.Proceed || vs[1].Status != dedup.Proceed {
		t.Fatalf("after the batch release: %v %v, %v; want proceed twice", vs[0].Status, vs[1].Status, errs)
	}

	srv.Kill()
	start := time.Now()
	_, errs = claimAll(now, dedup.Claim{Key: dedup.KeyOf("a"), MsgID: "m"}, dedup.Claim{Key: dedup.KeyOf("b"), MsgID: "m"})
	for i, err := range errs {
		if !errors.Is(err, dedup.ErrUnavailable) {
			t.Fatalf("claim %d with the server down: %v, want ErrUnavailable", i, err)
		}
	}
	errs = make([]error, 2)
	s.CommitBatch(ctx, []dedup.Entry{{Key: dedup.KeyOf("a"), MsgID: "m", Expires: now.Add(time.Minute)}, {Key: dedup.KeyOf("b"), MsgID: "m", Expires: now.Add(time.Minute)}}, errs)
	for i, err := range errs {
		if !errors.Is(err, dedup.ErrUnavailable) {
			t.Fatalf("commit %d with the server down: %v, want ErrUnavailable", i, err)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the batch calls took %v to fail with the server down, beyond twice the store's timeout and its retries", took)
	}
}
