package redisaudit_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/audit/redisaudit"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

var t0 = time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC)

func open(t *testing.T, prefix string) *redisaudit.Target {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	r, err := redisaudit.Open(ctx, testenv.RedisURL(t), redisaudit.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

func filter(t *testing.T, capacity uint) *audit.Filter {
	t.Helper()
	f, err := audit.New(audit.Options{Horizon: 7 * 24 * time.Hour, Capacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// Two replicas pool what they emitted; a third process starting later
// (a restart) loads all of it; a pipeline with another filter shape does
// not mix with them.
func TestReplicasShareAndRestartsLoad(t *testing.T) {
	ctx := t.Context()
	prefix := fmt.Sprintf("test-%d:", time.Now().UnixNano())
	a, b := filter(t, 100_000), filter(t, 100_000)
	ra, rb := open(t, prefix), open(t, prefix)
	k1, k2, k3 := dedup.KeyOf("k1"), dedup.KeyOf("k2"), dedup.KeyOf("k3")
	a.Add(k1, t0)
	b.Add(k2, t0.Add(time.Minute))
	if err := ra.Save(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := rb.Save(ctx, b); err != nil {
		t.Fatal(err)
	}
	if !b.Contains(k1, t0.Add(time.Hour)) {
		t.Fatal("replica B did not learn replica A's key at its save")
	}
	a.Add(k3, t0.Add(25*time.Hour)) // another generation
	if err := ra.Save(ctx, a); err != nil {
		t.Fatal(err)
	}
	c := filter(t, 100_000)
	if found, err := open(t, prefix).Load(ctx, c); err != nil || !found {
		t.Fatalf("load: %v, %v", found, err)
	}
	for _, k := range []dedup.Key{k1, k2, k3} {
		if !c.Contains(k, t0.Add(26*time.Hour)) {
			t.Errorf("restarted process lacks key %v", k)
		}
	}
	if c.Contains(dedup.KeyOf("never"), t0.Add(26*time.Hour)) {
		t.Error("restarted process reports a key never added")
	}
	if n := c.Stats().Keys; n < 3 || n > 4 {
		t.Errorf("restarted process estimates %d keys, want about 3", n)
	}
	other := filter(t, 200_000)
	if found, err := open(t, prefix).Load(ctx, other); err != nil || found {
		t.Fatalf("a filter of another shape loaded %v, %v", found, err)
	}
}

// Saving with nothing new sends nothing, and a failed save is retried.
func TestSaveFailureKeepsDirty(t *testing.T) {
	ctx := t.Context()
	prefix := fmt.Sprintf("test-%d:", time.Now().UnixNano())
	f := filter(t, 10_000)
	r := open(t, prefix)
	f.Add(dedup.KeyOf("k"), t0)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Save(cctx, f); err == nil {
		t.Fatal("save with a cancelled context succeeded")
	}
	if err := r.Save(ctx, f); err != nil {
		t.Fatal(err)
	}
	g := filter(t, 10_000)
	if found, err := r.Load(ctx, g); err != nil || !found || !g.Contains(dedup.KeyOf("k"), t0) {
		t.Fatalf("the key of a failed save was not saved on the retry: %v, %v", found, err)
	}
}
