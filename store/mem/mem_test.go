package mem_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/store/mem"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) dedup.Store { return mem.New() })
}

func commitAt(t *testing.T, s *mem.Store, k dedup.Key, now, expires time.Time) {
	t.Helper()
	ctx := context.Background()
	if v, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: "m1", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil || v.Status != dedup.Proceed {
		t.Fatalf("claim: %v, %v", v.Status, err)
	}
	if err := s.Commit(ctx, k, "m1", expires); err != nil {
		t.Fatal(err)
	}
}

func statusAt(t *testing.T, s *mem.Store, k dedup.Key, now time.Time) dedup.Status {
	t.Helper()
	v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: "m2", Now: now, LeaseUntil: now.Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if v.Status == dedup.Proceed {
		_ = s.Release(context.Background(), k, "m2")
	}
	return v.Status
}

// A key that expires far in the future must not disturb the others.
func TestFarFutureExpiry(t *testing.T) {
	s := mem.New()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	near, far := dedup.KeyOf("near"), dedup.KeyOf("far")
	commitAt(t, s, near, t0, t0.Add(time.Hour))
	commitAt(t, s, far, t0, t0.AddDate(10, 0, 0))
	if st := statusAt(t, s, near, t0.Add(30*time.Minute)); st != dedup.Duplicate {
		t.Fatalf("near key after a far one: %v, want duplicate", st)
	}
	if st := statusAt(t, s, near, t0.Add(2*time.Hour)); st != dedup.Proceed {
		t.Fatalf("near key after its horizon: %v, want proceed", st)
	}
	// Held at the end of the store's range (months past MaxHorizon).
	if st := statusAt(t, s, far, t0.AddDate(0, 0, 200)); st != dedup.Duplicate {
		t.Fatalf("far key 200 days on: %v, want duplicate", st)
	}
}

// Ticks run out after months of uptime; the store rebases them without
// forgetting live keys.
func TestLongUptime(t *testing.T) {
	s := mem.New()
	const horizon = mem.MaxHorizon
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for day := 0; day < 600; day++ {
		now := t0.AddDate(0, 0, day)
		k := dedup.KeyOf(fmt.Sprint("day", day))
		commitAt(t, s, k, now, now.Add(horizon))
		if day >= 30 {
			if st := statusAt(t, s, dedup.KeyOf(fmt.Sprint("day", day-30)), now); st != dedup.Duplicate {
				t.Fatalf("day %d: the key of day %d is %v, want duplicate", day, day-30, st)
			}
		}
		if day >= 91 {
			if st := statusAt(t, s, dedup.KeyOf(fmt.Sprint("day", day-91)), now); st != dedup.Proceed {
				t.Fatalf("day %d: the key of day %d is %v, want expired", day, day-91, st)
			}
		}
	}
}
