package disk

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
)

func open(t testing.TB, path string, opt Options) *Store {
	t.Helper()
	s, err := Open(context.Background(), path, opt)
	if err != nil {
		t.Fatalf("open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) dedup.Store {
		return open(t, filepath.Join(t.TempDir(), "db"), Options{})
	})
}

func claim(t *testing.T, s *Store, k dedup.Key, id string, now time.Time) dedup.Verdict {
	t.Helper()
	v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(30 * time.Second)})
	if err != nil {
		t.Fatalf("claim: %v", err)
	}
	return v
}

func commit(t *testing.T, s *Store, k dedup.Key, id string, exp time.Time) {
	t.Helper()
	if err := s.Commit(context.Background(), k, id, exp); err != nil {
		t.Fatalf("commit: %v", err)
	}
}

// TestReopenKeepsHorizon: committed keys are duplicates after a clean
// reopen, with the same redelivery / republish answer; pending claims are
// not kept (no one holds a lease after a restart).
func TestReopenKeepsHorizon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	now := time.Now()
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	done, pend := dedup.KeyOf("done"), dedup.KeyOf("pending")
	claim(t, s, done, "m1", now)
	commit(t, s, done, "m1", now.Add(time.Hour))
	claim(t, s, pend, "m1", now)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Claim(context.Background(), dedup.Claim{Key: done, MsgID: "x", Now: now}); err == nil {
		t.Fatal("claim on a closed store succeeded")
	}
	s = open(t, path, Options{})
	if v := claim(t, s, done, "m1", now.Add(time.Second)); v.Status != dedup.Duplicate || v.Kind != dedup.Redelivery {
		t.Fatalf("committed key after reopen: %v/%v, want duplicate/redelivery", v.Status, v.Kind)
	}
	if v := claim(t, s, done, "m2", now.Add(time.Second)); v.Kind != dedup.Republish {
		t.Fatalf("republish after reopen: %v/%v", v.Status, v.Kind)
	}
	if v := claim(t, s, pend, "m2", now.Add(time.Second)); v.Status != dedup.Proceed {
		t.Fatalf("pending key after reopen: %v, want proceed", v.Status)
	}
}

// TestReopenKeepsSlidingOwner: a republished copy that extends a key on
// the sliding horizon keeps the key's first message as its owner on disk,
// so after a restart that message's redelivery is still told apart from a
// republish, as it was before.
func TestReopenKeepsSlidingOwner(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	now := time.Now()
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	k := dedup.KeyOf("order-7")
	claim(t, s, k, "m1", now)
	commit(t, s, k, "m1", now.Add(time.Minute))
	at := now.Add(time.Second)
	v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: "m2", Now: at, LeaseUntil: at.Add(30 * time.Second), Extend: at.Add(2 * time.Minute)})
	if err != nil || v.Status != dedup.Duplicate || v.Kind != dedup.Republish {
		t.Fatalf("republish extending the key: %v/%v, %v", v.Status, v.Kind, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, Options{})
	later := now.Add(90 * time.Second) // past the first expiry, inside the extended one
	if v := claim(t, s, k, "m1", later); v.Status != dedup.Duplicate || v.Kind != dedup.Redelivery {
		t.Errorf("the first message again after reopen: %v/%v, want duplicate/redelivery", v.Status, v.Kind)
	}
	if v := claim(t, s, k, "m3", later); v.Status != dedup.Duplicate || v.Kind != dedup.Republish {
		t.Errorf("another copy after reopen: %v/%v, want duplicate/republish", v.Status, v.Kind)
	}
}

func TestFileHeldByAnotherStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	open(t, path, Options{})
	_, err := Open(context.Background(), path, Options{})
	if err == nil || !strings.Contains(err.Error(), "another process holds it") {
		t.Fatalf("second open: %v, want an error naming the lock", err)
	}
}

// A path that is a regular file (a file written by something else, or a
// typo) is refused with a message that says so, and left as it was.
func TestPathIsAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	if err := os.WriteFile(path, []byte("not a store"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), path, Options{})
	if err == nil || !strings.Contains(err.Error(), "it is a file") {
		t.Fatalf("open on a file: %v, want an error saying the path is a file", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "not a store" {
		t.Fatalf("the file was changed: %q", b)
	}
}

// TestSweepReadsOnlyExpired: after a sweep, expired keys are gone from the
// file and the index, live ones stay, and the sweep looked at the expired
// group and the first live one only.
func TestSweepReadsOnlyExpired(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, Options{SweepEvery: time.Hour}) // no background sweep here
	now := time.Now()
	const expired, live = 300, 700
	// Three groups, as three busy moments would write them: the expired
	// keys, then the live ones in two.
	var groups [3]*group
	for i := range groups {
		groups[i] = newGroup()
	}
	for i := range expired + live {
		g, r := groups[0], rec{exp: now.Add(time.Duration(i+1) * time.Millisecond).UnixNano(), tag: 1}
		if i >= expired {
			g, r.exp = groups[1+i%2], now.Add(time.Hour+time.Duration(i)*time.Millisecond).UnixNano()
		}
		k := dedup.KeyOf(fmt.Sprint(i))
		g.keys, g.recs = append(g.keys, k), append(g.recs, r)
		s.set.Commit(k, r.tag, r.exp)
	}
	for _, g := range groups {
		if s.w.write(g, 0); g.err != nil {
			t.Fatal(g.err)
		}
	}
	s.w.examined.Store(0)
	n, err := s.Sweep(context.Background(), now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if n != expired {
		t.Fatalf("swept %d, want %d", n, expired)
	}
	if got := s.w.examined.Load(); got != 2 {
		t.Fatalf("sweep examined %d groups, want 2 (the expired one and one live)", got)
	}
	if got := s.Len(); got != live {
		t.Fatalf("index holds %d keys after sweep, want %d", got, live)
	}
	// A claim judged at a time when the expired keys were still live says
	// proceed: they are gone, as a sweep at now+1m says they should be.
	if v := claim(t, s, dedup.KeyOf("0"), "m", now); v.Status != dedup.Proceed {
		t.Fatalf("swept key: %v", v.Status)
	}
	if v := claim(t, s, dedup.KeyOf(fmt.Sprint(expired)), "m", now.Add(time.Minute)); v.Status != dedup.Duplicate {
		t.Fatalf("live key: %v", v.Status)
	}
	s.Close()
	s = open(t, path, Options{})
	if got := s.Len(); got != live {
		t.Fatalf("reopened file holds %d keys, want %d", got, live)
	}
}

// TestBackgroundSweep: the store sweeps by itself, by the clock of the
// claims it sees.
func TestBackgroundSweep(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{SweepEvery: 10 * time.Millisecond})
	now := time.Now()
	for i := range 50 {
		commit(t, s, dedup.KeyOf(fmt.Sprint("short", i)), "m", now.Add(time.Second))
		commit(t, s, dedup.KeyOf(fmt.Sprint("long", i)), "m", now.Add(time.Hour))
	}
	claim(t, s, dedup.KeyOf("clock"), "m", now.Add(2*time.Second)) // moves the clock
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != 51 { // the long keys and the pending claim
		if time.Now().After(deadline) {
			t.Fatalf("index holds %d keys 10s after they expired, want 51", s.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

const childEnv = "DEDUPFLOW_DISK_KILL_CHILD"

// TestSurvivesKill9 runs a child process that commits keys from many
// goroutines and prints each one after its Commit returned, kills it with
// SIGKILL mid-stream, reopens the file and checks that every printed key is
// a duplicate.
func TestSurvivesKill9(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestKillChild$", "-test.v")
	cmd.Env = append(os.Environ(), childEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var committed []int
	sc := bufio.NewScanner(out)
	for sc.Scan() && len(committed) < 3000 {
		if n, ok := strings.CutPrefix(sc.Text(), "committed "); ok {
			i, err := strconv.Atoi(n)
			if err != nil {
				t.Fatalf("child said %q", sc.Text())
			}
			committed = append(committed, i)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if len(committed) < 3000 {
		t.Fatalf("child reported only %d commits before it ended", len(committed))
	}
	s := open(t, path, Options{})
	now := time.Now()
	for _, i := range committed {
		v := claim(t, s, dedup.KeyOf(fmt.Sprint("key", i)), fmt.Sprint("msg", i), now)
		if v.Status != dedup.Duplicate || v.Kind != dedup.Redelivery {
			t.Fatalf("key %d committed before kill -9 is %v/%v after reopen", i, v.Status, v.Kind)
		}
	}
	t.Logf("%d committed keys survived kill -9 (%d keys in the file)", len(committed), s.Len())
}

// TestKillChild is the child of TestSurvivesKill9; it does nothing unless
// that test started it.
func TestKillChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		return
	}
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // one line per write to the pipe
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				n := i
				i++
				next.Unlock()
				now := time.Now()
				k, id := dedup.KeyOf(fmt.Sprint("key", n)), fmt.Sprint("msg", n)
				if _, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
					panic(err)
				}
				if err := s.Commit(context.Background(), k, id, now.Add(time.Hour)); err != nil {
					panic(err)
				}
				mu.Lock()
				fmt.Fprintf(os.Stdout, "committed %d\n", n)
				mu.Unlock()
			}
		}()
	}
	wg.Wait() // never: the parent kills us
}

// TestStaleClaimsDropped: claims nobody committed or released are
// forgotten once their lease ended.
func TestStaleClaimsDropped(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "db"), Options{SweepEvery: 10 * time.Millisecond})
	now := time.Now()
	claim(t, s, dedup.KeyOf("abandoned"), "m", now)
	claim(t, s, dedup.KeyOf("clock"), "m", now.Add(time.Minute)) // moves the clock past the first lease
	deadline := time.Now().Add(10 * time.Second)
	for s.Len() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("%d claims held, want 1", s.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
