package e2e

// What the replica and outage tests share: an output reader that tells
// copies the pipelines published from redeliveries to it, replica
// processes with their logs and metrics, and key prefixes per test.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	goredis "github.com/redis/go-redis/v9"
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

// await polls done until it holds, failing t after within with the progress
// done reports, or at once when one of procs (a pipeline's runs) exits by
// itself.
func await(t *testing.T, within time.Duration, done func() (bool, string), procs ...*pipelineProc) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		ok, progress := done()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v %s\n%s", within, progress, procs[0].tail())
		}
		for i, p := range procs {
			if p.exited() {
				t.Fatalf("pipeline %d of %d exited by itself\n%s", i+1, len(procs), p.tail())
			}
		}
		time.Sleep(250 * time.Millisecond)
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
