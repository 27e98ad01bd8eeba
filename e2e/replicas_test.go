package e2e

// Issue 5's acceptance tests for the Redis store, driven through the
// binary as the crash tests are (and with their helpers: crashEnv,
// pipelineProc, publish, seekTo):
//
//   - TestReplicasShareRedis: three `dedupflow pipeline` processes read one
//     subscription and share one Redis; republished copies and a seek back
//     in time (redeliveries of acknowledged messages, same IDs) must leave
//     every key on the output topic exactly once, and every process must
//     have done part of the work.
//   - TestRedisOutagePaused / TestRedisOutageRestarted: one pipeline on a
//     Redis of its own that goes away for 10 s mid-stream — frozen with
//     SIGSTOP (a hung server or a partition: the connections stay open and
//     requests time out) or killed with SIGKILL and restarted on the same
//     port from its append-only file (a crash: connections are refused and
//     what was in flight is lost, what was acknowledged survives). /readyz
//     must turn 503 while it is away and 200 after, the store's loss and
//     return must be logged once each (not per message), and the output
//     must hold every key exactly once.

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

const (
	replicaCount = 3
	replicaKeys  = 50_000
	replicaPace  = 15 * time.Second
)

func TestReplicasShareRedis(t *testing.T) {
	t.Parallel()
	redisURL := testenv.RedisURL(t)
	seed := crashSeed(t)
	e := newCrashEnv(t)
	e.createTopicSub("input", "in-sub")
	e.createTopicSub("output", "out-sub")
	prefix := fmt.Sprintf("dedupflow-test:replicas:%d:", time.Now().UnixNano())
	t.Cleanup(func() { dropPrefix(redisURL, prefix) })
	state := withPrefix(t, redisURL, prefix)

	out := readOutput(e, "out-sub")
	procs := startReplicas(t, e, state)
	bases := make([]string, replicaCount)
	for i, p := range procs {
		bases[i] = p.metricsBase(t)
	}
	received := func() (sum float64) {
		for _, b := range bases {
			m, err := testenv.Scrape(b)
			if err != nil {
				t.Fatalf("scrape %s: %v", b, err)
			}
			sum += m["dedupflow_received_total"]
		}
		return sum
	}

	keys := crashKeys(replicaKeys, "rk")
	start := time.Now()
	published := e.publishInBackground(t, keys, replicaPace, seed)
	// Halfway through, seek back before the first publish: everything
	// published so far is delivered again with the same message IDs, to
	// whichever replica, while the rest is still arriving.
	time.Sleep(replicaPace / 2)
	seekAt, _ := out.state()
	if err := e.seekTo("in-sub", start.Add(-time.Second)); err != nil {
		t.Fatalf("seek: %v", err)
	}
	pub := published()
	t.Logf("%v; seeked back to the start with %d keys through", pub, seekAt)

	// Done when every key came out, nothing new came out for 3 s and the
	// replicas received nothing for 3 s (the redelivered backlog is drained).
	last, lastChange := received(), time.Now()
	await(t, 90*time.Second, func() (bool, string) {
		seen, quiet := out.state()
		if r := received(); r != last {
			last, lastChange = r, time.Now()
		}
		return seen >= len(keys) && quiet > 3*time.Second && time.Since(lastChange) > 3*time.Second,
			fmt.Sprintf("%d of %d keys came out, %v messages received", seen, len(keys), last)
	}, procs...)
	t.Logf("all keys out and the input drained %v after the first publish", time.Since(start).Round(time.Millisecond))
	for _, p := range procs {
		p.stop()
	}
	out.close(t)

	var emitted, redeliveries, republishes, receivedSum float64
	for i, p := range procs {
		c := p.stopped(t)
		if c == nil {
			continue
		}
		t.Logf("replica %d: received %v, emitted %v, redeliveries %v, republishes %v", i, c["received"], c["emitted"], c["redeliveries"], c["republishes"])
		if c["emitted"] <= 0 {
			t.Errorf("replica %d emitted nothing: it took no part", i)
		}
		emitted += c["emitted"]
		redeliveries += c["redeliveries"]
		republishes += c["republishes"]
		receivedSum += c["received"]
	}
	out.check(t, keys, pub)
	if int(emitted) != len(keys) {
		t.Errorf("the replicas emitted %v messages in all for %d keys", emitted, len(keys))
	}
	if redeliveries == 0 {
		t.Errorf("no redelivery was counted: the seek did not redeliver, the test proved nothing about them")
	}
	if republishes == 0 {
		t.Errorf("no republish was counted")
	}
	if receivedSum < float64(pub.total) {
		t.Errorf("the replicas received %v messages, fewer than the %d published", receivedSum, pub.total)
	}
}

// dbsize is the number of keys in the server's database 0.
func dbsize(r *testenv.Redis) int64 {
	c := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer c.Close()
	n, _ := c.DBSize(context.Background()).Result()
	return n
}

const (
	outageKeys     = 8_000
	outagePace     = 24 * time.Second
	outageAt       = 7 * time.Second
	outageLength   = 10 * time.Second
	storeDownMsg   = "dedup store unreachable: holding messages, nacking and backing off"
	storeBackMsg   = "dedup store reachable again, resuming"
	claimLeaseWait = 40 * time.Second // the claim lease (30 s) and a margin
)

func TestRedisOutagePaused(t *testing.T)    { testRedisOutage(t, false) }
func TestRedisOutageRestarted(t *testing.T) { testRedisOutage(t, true) }

// testRedisOutage takes Redis away for outageLength while a stream is
// being published: frozen (SIGSTOP … SIGCONT), or killed and restarted on
// the same port from an append-only file fsynced on every write, so what
// Redis acknowledged before the crash is still there after it (with
// --save ” and no AOF a restart would forget the whole horizon, and
// "nothing emitted twice" could not hold for any store).
func testRedisOutage(t *testing.T, restart bool) {
	t.Parallel()
	seed := crashSeed(t)
	var aof []string
	if restart {
		aof = []string{"--appendonly", "yes", "--appendfsync", "always"}
	}
	r := testenv.StartRedis(t, aof...)
	e := newCrashEnv(t)
	e.createTopicSub("input", "in-sub")
	e.createTopicSub("output", "out-sub")
	out := readOutput(e, "out-sub")
	p := newReplica(t, e, "pipeline", pipelineArgs(e, r.URL()))
	p.start()
	t.Cleanup(p.end)
	p.waitLog(t, "pipeline running", 30*time.Second)
	base := p.metricsBase(t)
	if c := testenv.Readyz(base); c != http.StatusOK {
		t.Fatalf("/readyz before the outage: %d, want 200", c)
	}

	keys := crashKeys(outageKeys, "ok")
	start := time.Now()
	published := e.publishInBackground(t, keys, outagePace, seed)

	time.Sleep(outageAt)
	before, _ := out.state()
	how := "SIGSTOP"
	if restart {
		how = "SIGKILL"
		r.Kill()
	} else if err := r.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	var firstNotReady time.Duration = -1
	for time.Since(down) < outageLength {
		if firstNotReady < 0 && testenv.Readyz(base) == http.StatusServiceUnavailable {
			firstNotReady = time.Since(down)
		}
		time.Sleep(100 * time.Millisecond)
	}
	during, _ := out.state()
	if restart {
		r.Start()
	} else if err := r.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var readyAgain time.Duration = -1
	for time.Since(up) < 30*time.Second {
		if testenv.Readyz(base) == http.StatusOK {
			readyAgain = time.Since(up)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("Redis away (%s) %v after the first publish for %v with %d keys through; %d more came out meanwhile; /readyz 503 after %v, 200 again %v after its return; %d Redis keys after it",
		how, outageAt, outageLength, before, during-before, firstNotReady.Round(time.Millisecond), readyAgain.Round(time.Millisecond), dbsize(r))
	if firstNotReady < 0 {
		t.Errorf("/readyz never answered 503 during the %v Redis was away", outageLength)
	}
	if readyAgain < 0 {
		t.Errorf("/readyz did not answer 200 within 30 s of Redis's return")
	}

	pub := published()
	t.Log(pub)

	// Done when every key came out, the lease of any claim left pending by
	// the outage has ended (a copy waiting on it could then be emitted
	// again), and nothing new came out for 5 s.
	await(t, 90*time.Second, func() (bool, string) {
		seen, quiet := out.state()
		return seen >= len(keys) && time.Since(up) > claimLeaseWait && quiet > 5*time.Second,
			fmt.Sprintf("%d of %d keys came out", seen, len(keys))
	}, p)
	t.Logf("all keys out %v after the first publish", time.Since(start).Round(time.Millisecond))
	if c := testenv.Readyz(base); c != http.StatusOK {
		t.Errorf("/readyz at the end: %d, want 200", c)
	}
	p.stop()
	out.close(t)

	if c := p.stopped(t); c != nil {
		t.Logf("pipeline: received %v, emitted %v, redeliveries %v, republishes %v", c["received"], c["emitted"], c["redeliveries"], c["republishes"])
		if int(c["emitted"]) != len(keys) {
			t.Errorf("the pipeline emitted %v messages for %d keys", c["emitted"], len(keys))
		}
	}
	// One line when the store goes away, one when it returns; nothing
	// else above info (a per-message warning would be one per message).
	var downs, backs int
	var changes []string
	others := map[string]int{}
	for _, m := range p.logLines() {
		switch m["msg"] {
		case storeDownMsg:
			downs++
			changes = append(changes, fmt.Sprintf("%v down (%v)", m["time"], m["err"]))
		case storeBackMsg:
			backs++
			changes = append(changes, fmt.Sprintf("%v back", m["time"]))
		default:
			if lv, _ := m["level"].(string); lv == "WARN" || lv == "ERROR" {
				others[fmt.Sprint(m["msg"])]++
			}
		}
	}
	t.Logf("log: %d × %q, %d × %q, other warnings %v", downs, storeDownMsg, backs, storeBackMsg, others)
	if downs != 1 || backs != 1 {
		t.Errorf("the store's loss and return were logged %d and %d times, want once each (Redis away %s to %s):\n%s",
			downs, backs, down.Format(time.RFC3339Nano), up.Format(time.RFC3339Nano), strings.Join(changes, "\n"))
	}
	for msg, n := range others {
		t.Errorf("%d warnings %q besides the store's loss and return (one per message, not one per outage)", n, msg)
	}
	out.check(t, keys, pub)
}
