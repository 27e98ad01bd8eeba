package main

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
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// outputReader reads an output subscription and records, per key, the
// distinct output message IDs: two IDs for one key means the pipeline
// emitted it twice (a redelivery to this reader keeps its ID).
type outputReader struct {
	mu       sync.Mutex
	ids      map[string]map[string]bool
	noAttr   int
	received int
	lastNew  time.Time
	stop     func()
	done     chan error
}

func readOutput(e *crashEnv, sub string) *outputReader {
	r := &outputReader{ids: map[string]map[string]bool{}, done: make(chan error, 1), lastNew: time.Now()}
	ctx, cancel := context.WithCancel(context.Background())
	r.stop = cancel
	go func() {
		s := e.client.Subscriber(e.sub(sub))
		s.ReceiveSettings.MaxOutstandingMessages = 5000
		r.done <- s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			key := strings.TrimPrefix(string(m.Data), "payload-")
			r.mu.Lock()
			r.received++
			if m.Attributes["eid"] != key {
				r.noAttr++
			}
			if r.ids[key] == nil {
				r.ids[key] = map[string]bool{}
			}
			if !r.ids[key][m.ID] {
				r.ids[key][m.ID] = true
				r.lastNew = time.Now()
			}
			r.mu.Unlock()
			m.Ack()
		})
	}()
	return r
}

// state is how many keys came out and how long since a new output.
func (r *outputReader) state() (keys int, quiet time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ids), time.Since(r.lastNew)
}

func (r *outputReader) close(t *testing.T) {
	r.stop()
	if err := <-r.done; err != nil {
		t.Errorf("reading the output: %v", err)
	}
}

// check asserts that every key came out exactly once and nothing else did.
func (r *outputReader) check(t *testing.T, keys []string, pub *published) {
	t.Helper()
	r.judge(t, keys, pub, false)
}

// leaks asserts that every key came out and nothing else did, and returns
// how many keys came out more than once.
func (r *outputReader) leaks(t *testing.T, keys []string, pub *published) int {
	t.Helper()
	return r.judge(t, keys, pub, true)
}

func (r *outputReader) judge(t *testing.T, keys []string, pub *published, twiceOK bool) (twiceN int) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var missing, twice, unexpected []string
	outputs := 0
	for _, k := range keys {
		switch c := len(r.ids[k]); {
		case c == 0:
			missing = append(missing, k)
		case c > 1:
			twice = append(twice, fmt.Sprintf("%s×%d", k, c))
		}
	}
	for k, ids := range r.ids {
		outputs += len(ids)
		if _, ok := pub.ids[k]; !ok {
			unexpected = append(unexpected, k)
		}
	}
	t.Logf("output: %d distinct messages (%d deliveries to the reader) for %d of %d keys; missing %d, emitted more than once %d, never published %d, without the key attribute %d",
		outputs, r.received, len(r.ids), len(keys), len(missing), len(twice), len(unexpected), r.noAttr)
	bad := map[string][]string{"never came out": missing, "came out but were never published": unexpected}
	if !twiceOK {
		bad["came out more than once"] = twice
	}
	for what, list := range bad {
		if len(list) > 0 {
			sort.Strings(list)
			t.Errorf("%d keys %s, e.g. %s", len(list), what, strings.Join(list[:min(8, len(list))], ", "))
		}
	}
	if r.noAttr > 0 {
		t.Errorf("%d outputs lack the eid attribute", r.noAttr)
	}
	return len(twice)
}

// startReplicas starts replicaCount pipelines reading e's in-sub with
// state and waits until each runs.
func startReplicas(t *testing.T, e *crashEnv, state string) []*pipelineProc {
	t.Helper()
	procs := make([]*pipelineProc, replicaCount)
	for i := range procs {
		procs[i] = newReplica(t, e, fmt.Sprintf("replica-%d", i), pipelineArgs(e, state))
		procs[i].start()
		t.Cleanup(procs[i].end)
	}
	for _, p := range procs {
		p.waitLog(t, "pipeline running", 30*time.Second)
	}
	return procs
}

// running fails t if one of procs exited by itself.
func running(t *testing.T, procs []*pipelineProc) {
	t.Helper()
	for i, p := range procs {
		if p.exited() {
			t.Fatalf("replica %d exited by itself\n%s", i, p.tail())
		}
	}
}

// replica is one pipeline process with a log folder of its own (the
// crash harness names its logs run-NN.log in its env's folder).
func newReplica(t *testing.T, e *crashEnv, name string, args []string) *pipelineProc {
	t.Helper()
	re := *e
	re.dir = filepath.Join(e.dir, name)
	if err := os.Mkdir(re.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return &pipelineProc{e: &re, args: args}
}

func (p *pipelineProc) logPath() string {
	return filepath.Join(p.e.dir, fmt.Sprintf("run-%02d.log", p.runs))
}

// logLines are the current run's JSON log records.
func (p *pipelineProc) logLines() []map[string]any {
	b, _ := os.ReadFile(p.logPath())
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

// waitLog waits for a record with msg and returns it.
func (p *pipelineProc) waitLog(t *testing.T, msg string, within time.Duration) map[string]any {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		for _, m := range p.logLines() {
			if m["msg"] == msg {
				return m
			}
		}
		if p.exited() || time.Now().After(deadline) {
			t.Fatalf("no %q in the log within %v\n%s", msg, within, p.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metricsBase waits for the process to serve metrics and returns its base URL.
func (p *pipelineProc) metricsBase(t *testing.T) string {
	t.Helper()
	u, _ := p.waitLog(t, "metrics and health", 30*time.Second)["url"].(string)
	return strings.TrimSuffix(u, "/metrics")
}

// scrape reads /metrics into name{labels} -> value.
func scrape(base string) (map[string]float64, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

func readyz(base string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(base + "/readyz")
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// stopped is the final "pipeline stopped" record's counters.
func (p *pipelineProc) stopped(t *testing.T) map[string]float64 {
	t.Helper()
	for _, m := range p.logLines() {
		if m["msg"] == "pipeline stopped" {
			out := map[string]float64{}
			for k, v := range m {
				if f, ok := v.(float64); ok {
					out[k] = f
				}
			}
			return out
		}
	}
	t.Errorf("%s: no \"pipeline stopped\" line\n%s", p.e.dir, p.tail())
	return nil
}

// withPrefix gives a Redis URL a prefix= of its own.
func withPrefix(t *testing.T, raw, prefix string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

// dropPrefix removes every key under prefix.
func dropPrefix(raw, prefix string) {
	o, err := goredis.ParseURL(raw)
	if err != nil {
		return
	}
	c := goredis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	it := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	var batch []string
	for it.Next(ctx) {
		if batch = append(batch, it.Val()); len(batch) == 1000 {
			c.Unlink(ctx, batch...)
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		c.Unlink(ctx, batch...)
	}
}

func pipelineArgs(e *crashEnv, state string) []string {
	return []string{"pipeline",
		"--input-subscription", e.sub("in-sub"), "--id-attribute", "eid", "--horizon", "10m",
		"--state", state, "--sink", "pubsub", "--output-topic", e.topic("output"),
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json", "--log-level", "info"}
}

const (
	replicaCount = 3
	replicaKeys  = 50_000
	replicaPace  = 15 * time.Second
)

func TestReplicasShareRedis(t *testing.T) {
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
			m, err := scrape(b)
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
	t.Logf("published %d messages for %d keys (%d republished copies) in %v; seeked back to the start with %d keys through",
		pub.total, len(keys), pub.total-len(keys), pub.took.Round(time.Millisecond), seekAt)

	// Done when every key came out, nothing new came out for 3 s and the
	// replicas received nothing for 3 s (the redelivered backlog is drained).
	deadline := time.Now().Add(90 * time.Second)
	last, lastChange := received(), time.Now()
	for {
		seen, quiet := out.state()
		if r := received(); r != last {
			last, lastChange = r, time.Now()
		}
		if seen >= len(keys) && quiet > 3*time.Second && time.Since(lastChange) > 3*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s %d of %d keys came out, %v messages received\n%s", seen, len(keys), last, procs[0].tail())
		}
		running(t, procs)
		time.Sleep(250 * time.Millisecond)
	}
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

// redisProc is a redis-server of the test's own.
type redisProc struct {
	t    *testing.T
	bin  string
	args []string
	cmd  *exec.Cmd
	log  string
	url  string
}

func startRedis(t *testing.T, aof bool) *redisProc {
	t.Helper()
	bin := testenv.RedisServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	r := &redisProc{t: t, bin: bin, log: filepath.Join(dir, "redis.log"), url: fmt.Sprintf("redis://127.0.0.1:%d/0", port)}
	r.args = []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--dir", dir,
		"--logfile", r.log, "--daemonize", "no"}
	if aof {
		r.args = append(r.args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		r.args = append(r.args, "--appendonly", "no")
	}
	r.start()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGCONT)
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	})
	return r
}

func (r *redisProc) start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, r.args...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	o, _ := goredis.ParseURL(r.url)
	c := goredis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(r.log)
			r.t.Fatalf("redis-server %v did not answer within 10 s: %v\n%s", r.args, err, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (r *redisProc) dbsize() int64 {
	o, _ := goredis.ParseURL(r.url)
	c := goredis.NewClient(o)
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
	seed := crashSeed(t)
	r := startRedis(t, restart)
	e := newCrashEnv(t)
	e.createTopicSub("input", "in-sub")
	e.createTopicSub("output", "out-sub")
	out := readOutput(e, "out-sub")
	p := newReplica(t, e, "pipeline", pipelineArgs(e, r.url))
	p.start()
	t.Cleanup(p.end)
	p.waitLog(t, "pipeline running", 30*time.Second)
	base := p.metricsBase(t)
	if c := readyz(base); c != http.StatusOK {
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
		_ = r.cmd.Process.Signal(syscall.SIGKILL)
		_ = r.cmd.Wait()
	} else if err := r.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	var firstNotReady time.Duration = -1
	for time.Since(down) < outageLength {
		if firstNotReady < 0 && readyz(base) == http.StatusServiceUnavailable {
			firstNotReady = time.Since(down)
		}
		time.Sleep(100 * time.Millisecond)
	}
	during, _ := out.state()
	if restart {
		r.start()
	} else if err := r.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	up := time.Now()
	var readyAgain time.Duration = -1
	for time.Since(up) < 30*time.Second {
		if readyz(base) == http.StatusOK {
			readyAgain = time.Since(up)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("Redis away (%s) %v after the first publish for %v with %d keys through; %d more came out meanwhile; /readyz 503 after %v, 200 again %v after its return; %d Redis keys after it",
		how, outageAt, outageLength, before, during-before, firstNotReady.Round(time.Millisecond), readyAgain.Round(time.Millisecond), r.dbsize())
	if firstNotReady < 0 {
		t.Errorf("/readyz never answered 503 during the %v Redis was away", outageLength)
	}
	if readyAgain < 0 {
		t.Errorf("/readyz did not answer 200 within 30 s of Redis's return")
	}

	pub := published()
	t.Logf("published %d messages for %d keys (%d republished copies) in %v",
		pub.total, len(keys), pub.total-len(keys), pub.took.Round(time.Millisecond))

	// Done when every key came out, the lease of any claim left pending by
	// the outage has ended (a copy waiting on it could then be emitted
	// again), and nothing new came out for 5 s.
	deadline := time.Now().Add(90 * time.Second)
	for {
		seen, quiet := out.state()
		if seen >= len(keys) && time.Since(up) > claimLeaseWait && quiet > 5*time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 90 s %d of %d keys came out\n%s", seen, len(keys), p.tail())
		}
		if p.exited() {
			t.Fatalf("the pipeline exited by itself\n%s", p.tail())
		}
		time.Sleep(250 * time.Millisecond)
	}
	t.Logf("all keys out %v after the first publish", time.Since(start).Round(time.Millisecond))
	if c := readyz(base); c != http.StatusOK {
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
