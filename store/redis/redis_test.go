package redis

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

func open(t testing.TB, url string, opt Options) *Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := Open(ctx, url, opt)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) {
	url := testenv.RedisURL(t)
	storetest.Run(t, func(t *testing.T) dedup.Store { return open(t, url, Options{}) })
}

// TestKeysUnderPrefix: records live under the prefix, as hex, and expire.
func TestKeysUnderPrefix(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := fmt.Sprintf("dedupflow-test-%d:", time.Now().UnixNano())
	s := open(t, url+"?prefix="+prefix, Options{})
	k, now := dedup.KeyOf(t.Name()), time.Now()
	if _, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: "m1", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), k, "m1", now.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rk := prefix + k.String()
	ttl, err := s.rdb.PTTL(context.Background(), rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 59*time.Minute || ttl > time.Hour+time.Second { // rounded up to the ms
		t.Fatalf("TTL of %s is %v, want about 1h", rk, ttl)
	}
}

// TestTTLSlack: with event time the watermark can trail the wall clock, so
// Redis must keep a key longer than the horizon measured from the watermark.
func TestTTLSlack(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := fmt.Sprintf("dedupflow-test-%d:", time.Now().UnixNano())
	s := open(t, url+"?prefix="+prefix, Options{TTLSlack: 10 * time.Minute})
	k := dedup.KeyOf(t.Name())
	watermark := time.Now().Add(-time.Hour) // an hour behind the wall clock
	if _, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: "m1", Now: watermark, LeaseUntil: watermark.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), k, "m1", watermark.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	ttl, err := s.rdb.PTTL(context.Background(), prefix+k.String()).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 10*time.Minute || ttl > 10*time.Minute+3*time.Second {
		t.Fatalf("TTL %v, want the 2 s horizon plus the 10 min slack", ttl)
	}
	// Logically the key is still judged by the times passed in.
	v, err := s.Claim(context.Background(), dedup.Claim{Key: k, MsgID: "m2", Now: watermark.Add(time.Second), LeaseUntil: watermark.Add(time.Minute)})
	if err != nil || v.Status != dedup.Duplicate {
		t.Fatalf("copy inside the event-time horizon: %v, %v; want a duplicate", v.Status, err)
	}
}

// TestScriptsForgotten: after the server forgot its scripts (SCRIPT FLUSH,
// as a restart does), the claim, release and sliding-horizon scripts run
// again: a republished copy still extends its key, a claim still meets a
// record, a release still drops its claim.
func TestScriptsForgotten(t *testing.T) {
	s := open(t, testenv.StartRedis(t).URL(), Options{})
	ctx, now := context.Background(), time.Now()
	claim := func(k dedup.Key, id string, at time.Time, extend time.Time) dedup.Verdict {
		t.Helper()
		v, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: id, Now: at, LeaseUntil: at.Add(time.Minute), Extend: extend})
		if err != nil {
			t.Fatalf("claim %s by %s: %v", k, id, err)
		}
		return v
	}
	done, held := dedup.KeyOf("done"), dedup.KeyOf("held")
	claim(done, "m1", now, time.Time{})
	if err := s.Commit(ctx, done, "m1", now.Add(10*time.Second)); err != nil {
		t.Fatal(err)
	}
	claim(held, "m1", now, time.Time{})
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if v := claim(done, "m2", now.Add(time.Second), now.Add(time.Minute)); v.Status != dedup.Duplicate || v.Kind != dedup.Republish {
		t.Fatalf("republish extending the key: %v/%v", v.Status, v.Kind)
	}
	// Past the first expiry, inside the extended one: still a duplicate.
	if v := claim(done, "m1", now.Add(30*time.Second), time.Time{}); v.Status != dedup.Duplicate || v.Kind != dedup.Redelivery {
		t.Errorf("after the extension: %v/%v, want duplicate/redelivery", v.Status, v.Kind)
	}
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Release(ctx, held, "m1"); err != nil {
		t.Fatal(err)
	}
	if v := claim(held, "m2", now.Add(time.Second), time.Time{}); v.Status != dedup.Proceed {
		t.Errorf("claim after the release: %v, want proceed", v.Status)
	}
	if err := s.rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	// Past the extended expiry the record is still in Redis (its TTL has
	// slack): taking it over is the claim script's.
	if v := claim(done, "m3", now.Add(2*time.Minute), time.Time{}); v.Status != dedup.Proceed {
		t.Errorf("claim past the expiry: %v, want proceed", v.Status)
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestServerRestart stops the server mid-stream: calls fail with
// dedup.ErrUnavailable while it is down and work again, on the same store
// and client, once it is back (the scripts it forgot included).
func TestServerRestart(t *testing.T) {
	srv := testenv.StartRedis(t)
	s := open(t, srv.URL(), Options{Timeout: 2 * time.Second})

	var seq atomic.Int64
	try := func() error {
		now := time.Now()
		k := dedup.KeyOf(fmt.Sprint("restart", seq.Add(1)))
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err == nil && v.Status != dedup.Proceed {
			return fmt.Errorf("fresh key: %v", v.Status)
		}
		return err
	}
	if err := try(); err != nil {
		t.Fatalf("before the stop: %v", err)
	}

	srv.Kill()
	down := time.Now()
	failures := 0
	for time.Since(down) < 3*time.Second {
		err := try()
		if err == nil {
			t.Fatal("a claim succeeded while the server was down")
		}
		if !errors.Is(err, dedup.ErrUnavailable) {
			t.Fatalf("while down: %v, want an error wrapping dedup.ErrUnavailable", err)
		}
		failures++
	}
	t.Logf("%d calls failed while the server was down; last error: %v", failures, try())

	srv.Start()
	var err error
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err = try(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("still failing 15s after the restart: %v", err)
	}
	// The restarted server has no scripts cached: a claim over an expired
	// commit and a release need them.
	k, now := dedup.KeyOf("after-restart"), time.Now()
	ctx := context.Background()
	if err := s.Commit(ctx, k, "m1", now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	v, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: "m2", Now: now.Add(2 * time.Second), LeaseUntil: now.Add(time.Minute)})
	if err != nil || v.Status != dedup.Proceed {
		t.Fatalf("claim over an expired commit after restart: %v, %v", v.Status, err)
	}
	if err := s.Release(ctx, k, "m2"); err != nil {
		t.Fatalf("release after restart: %v", err)
	}
}

// TestAuth: a password in the URL is used; a wrong one fails at Open with
// the server's answer, not as "unavailable".
func TestAuth(t *testing.T) {
	port := testenv.StartRedis(t, "--requirepass", "s3cret").Port
	s := open(t, fmt.Sprintf("redis://:s3cret@127.0.0.1:%d/0", port), Options{})
	now := time.Now()
	if _, err := s.Claim(context.Background(), dedup.Claim{Key: dedup.KeyOf("auth"), MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	_, err := Open(context.Background(), fmt.Sprintf("redis://:wrong@127.0.0.1:%d/0", port), Options{})
	if err == nil || errors.Is(err, dedup.ErrUnavailable) || !strings.Contains(err.Error(), "WRONGPASS") {
		t.Fatalf("open with a wrong password: %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("error shows the password: %v", err)
	}
}

func TestBadURLs(t *testing.T) {
	for _, u := range []string{
		"redis://127.0.0.1:1/0?cluster=maybe",
		"redis://127.0.0.1:1/0?prefix=",
		"redis://127.0.0.1:1/0?addr=127.0.0.1:2",
		"redis://127.0.0.1:1/0?bogus=1",
	} {
		if _, err := Open(context.Background(), u, Options{}); err == nil || errors.Is(err, dedup.ErrUnavailable) {
			t.Errorf("%s: %v, want a URL error", u, err)
		}
	}
	// A server that is not there is unavailable, not a bad URL.
	_, err := Open(context.Background(), fmt.Sprintf("redis://127.0.0.1:%d/0?dial_timeout=1s&max_retries=-1", freePort(t)), Options{})
	if !errors.Is(err, dedup.ErrUnavailable) {
		t.Errorf("nothing listening: %v, want ErrUnavailable", err)
	}
}

var _ goredis.UniversalClient = (*goredis.Client)(nil)
