package redis

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// startReplicated runs a master and one replica of the test's own and
// returns the master's URL, the replica's client and the replica's process.
func startReplicated(t testing.TB) (url string, replica *goredis.Client, stop func(sig syscall.Signal)) {
	t.Helper()
	m := testenv.StartRedis(t)
	r := testenv.StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(m.Port))
	replica = goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { replica.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		info, _ := replica.Info(context.Background(), "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica not in sync after 10 s:\n%s", info)
		}
	}
	return m.URL(), replica, func(sig syscall.Signal) { _ = r.Signal(sig) }
}

// TestWait: with wait=1 a commit returns once the replica holds it, and
// fails as unavailable (to be retried) while the replica is frozen.
func TestWait(t *testing.T) {
	url, replica, signal := startReplicated(t)
	// With the replica up, a loaded machine may take seconds to confirm;
	// frozen, it never does, and the short timeout ends the wait.
	s := open(t, url+"?wait=1", Options{Timeout: time.Minute})
	frozen := open(t, url+"?wait=1", Options{Timeout: time.Second})
	if s.b.wait != 1 {
		t.Fatalf("wait=1 in the URL set Options.Wait %d", s.b.wait)
	}
	ctx, now := context.Background(), time.Now()
	for i := range 50 {
		k := dedup.KeyOf(fmt.Sprint("wait", i))
		if _, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
		if err := s.Commit(ctx, k, "m", now.Add(time.Minute)); err != nil {
			t.Fatalf("commit with the replica up: %v", err)
		}
		// Returned means copied: the replica holds the commit already.
		v, err := replica.Get(ctx, s.key(k)).Result()
		if err != nil || v[0] != 'd' {
			t.Fatalf("replica holds %q (%v) right after the commit returned, want the commit", v, err)
		}
	}

	signal(syscall.SIGSTOP)
	defer signal(syscall.SIGCONT)
	k := dedup.KeyOf("frozen")
	start := time.Now()
	err := frozen.Commit(ctx, k, "m", now.Add(time.Minute))
	if !errors.Is(err, dedup.ErrUnavailable) || !errors.Is(err, errFewReplicas) {
		t.Fatalf("commit with the replica frozen: %v, want ErrUnavailable (too few replicas)", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the commit took %v to fail: the store's 1 s timeout did not end its wait", took)
	}
	signal(syscall.SIGCONT)
	// Back, the replica confirms again: the long-timeout store waits for it.
	if err = s.Commit(ctx, k, "m", now.Add(time.Minute)); err != nil {
		t.Fatalf("commit after the replica's return: %v", err)
	}
}

func TestWaitURL(t *testing.T) {
	for _, q := range []string{"wait=x", "wait=-1"} {
		_, err := Open(context.Background(), "redis://127.0.0.1:1/0?"+q, Options{})
		if err == nil || !strings.Contains(err.Error(), "want a number of replicas") {
			t.Errorf("%s: %v, want a clear error", q, err)
		}
	}
}

// TestWaitBatch: a batch commit under wait=1 returns once the replica holds
// every key of it, and with the replica frozen every claim that took a key
// and every commit of a batch fails as unavailable (too few replicas), none
// silently.
func TestWaitBatch(t *testing.T) {
	url, replica, signal := startReplicated(t)
	// With the replica up, a loaded machine may take seconds to confirm;
	// frozen, it never does, and the short timeout ends the wait.
	up := open(t, url+"?wait=1", Options{Timeout: time.Minute})
	frozen := open(t, url+"?wait=1", Options{Timeout: time.Second})
	ctx, now := context.Background(), time.Now()
	batch := func(s *Store, tag string, n int) (es []dedup.Entry, claimErrs, commitErrs []error) {
		cs := make([]dedup.Claim, n)
		es = make([]dedup.Entry, n)
		for i := range cs {
			k := dedup.KeyOf(fmt.Sprint(tag, i))
			cs[i] = dedup.Claim{Key: k, MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)}
			es[i] = dedup.Entry{Key: k, MsgID: "m", Expires: now.Add(time.Minute)}
		}
		vs := make([]dedup.Verdict, n)
		claimErrs, commitErrs = make([]error, n), make([]error, n)
		s.ClaimBatch(ctx, cs, vs, claimErrs)
		for i, err := range claimErrs {
			if err == nil && vs[i].Status != dedup.Proceed {
				t.Fatalf("claim %d: %v", i, vs[i].Status)
			}
		}
		s.CommitBatch(ctx, es, commitErrs)
		return es, claimErrs, commitErrs
	}
	es, claimErrs, commitErrs := batch(up, "waitbatch", 600) // more than one pipeline (MaxBatch 500)
	for i := range es {
		if claimErrs[i] != nil || commitErrs[i] != nil {
			t.Fatalf("item %d with the replica up: claim %v, commit %v", i, claimErrs[i], commitErrs[i])
		}
		if v, err := replica.Get(ctx, up.key(es[i].Key)).Result(); err != nil || v[0] != 'd' {
			t.Fatalf("replica holds %q (%v) for key %d right after the batch commit returned", v, err, i)
		}
	}

	signal(syscall.SIGSTOP)
	defer signal(syscall.SIGCONT)
	_, claimErrs, commitErrs = batch(frozen, "frozenbatch", 20)
	for i := range claimErrs {
		for _, err := range []error{claimErrs[i], commitErrs[i]} {
			if !errors.Is(err, dedup.ErrUnavailable) || !errors.Is(err, errFewReplicas) {
				t.Fatalf("item %d with the replica frozen: %v, want ErrUnavailable (too few replicas)", i, err)
			}
		}
	}
}
