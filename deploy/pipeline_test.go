package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	dto "github.com/prometheus/client_model/go"

	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// runningPipeline is a `dedupflow pipeline` process reading a broker.
type runningPipeline struct {
	cmd     *exec.Cmd
	metrics string      // base URL of /metrics, /healthz, /readyz
	lines   chan string // its log lines, in order; closed when it exits
	log     []string    // the lines read so far
}

const project = "deploy-test"

// topology is the broker and the resources a test pipeline reads and writes.
type topology struct {
	c                     *pubsub.Client
	addr                  string
	in, inSub, out        pubsubio.Name
	outSub, dead, deadSub pubsubio.Name
}

func newTopology(t testing.TB) *topology {
	t.Helper()
	addr := brokertest.Start(t)
	t.Setenv("PUBSUB_EMULATOR_HOST", addr)
	c := brokertest.Dial(t, addr, project)
	ctx := context.Background()
	name := func(kind, id string) pubsubio.Name { return pubsubio.Name{Project: project, Kind: kind, ID: id} }
	tp := &topology{c: c, addr: addr,
		in: name("topics", "events"), inSub: name("subscriptions", "events-dedup"),
		out: name("topics", "deduped"), outSub: name("subscriptions", "deduped-read"),
		dead: name("topics", "dead-letters"), deadSub: name("subscriptions", "dead-letters-read")}
	for _, tpc := range []pubsubio.Name{tp.in, tp.out, tp.dead} {
		if err := pubsubio.EnsureTopic(ctx, c, tpc); err != nil {
			t.Fatal(err)
		}
	}
	for sub, topic := range map[pubsubio.Name]pubsubio.Name{tp.inSub: tp.in, tp.outSub: tp.out, tp.deadSub: tp.dead} {
		if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 30); err != nil {
			t.Fatal(err)
		}
	}
	return tp
}

// startPipeline starts `dedupflow pipeline` on the topology with JSON logs
// and the metrics server on a free port, and waits until it serves
// metrics. It is stopped with SIGTERM when the test ends.
func startPipeline(t testing.TB, newCmd func(env []string, args ...string) *exec.Cmd, tp *topology, env []string, extra ...string) *runningPipeline {
	t.Helper()
	args := append([]string{"pipeline", "--project", project,
		"--input-subscription", tp.inSub.ID, "--output-topic", tp.out.ID, "--dead-letter-topic", tp.dead.ID,
		"--metrics-addr", "127.0.0.1:0", "--log-format", "json"}, extra...)
	cmd := newCmd(append([]string{"PUBSUB_EMULATOR_HOST=" + tp.addr}, env...), args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &runningPipeline{cmd: cmd, lines: make(chan string, 1000)}
	go func() {
		defer close(p.lines)
		s := bufio.NewScanner(stderr)
		for s.Scan() {
			p.lines <- s.Text()
		}
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	for p.metrics == "" {
		line, ok := p.next(t, 60*time.Second)
		if !ok {
			t.Fatalf("pipeline exited before serving metrics: %v\n%s", cmd.Wait(), strings.Join(p.log, "\n"))
		}
		var rec struct{ Msg, URL string }
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "metrics and health" {
			p.metrics = strings.TrimSuffix(rec.URL, "/metrics")
		}
	}
	return p
}

// next returns the next log line; false once the process closed stderr.
func (p *runningPipeline) next(t testing.TB, within time.Duration) (string, bool) {
	t.Helper()
	select {
	case line, ok := <-p.lines:
		if ok {
			p.log = append(p.log, line)
		}
		return line, ok
	case <-time.After(within):
		t.Fatalf("no log line from the pipeline within %v; so far:\n%s", within, strings.Join(p.log, "\n"))
		return "", false
	}
}

// stop sends SIGTERM, reads the remaining log lines and returns the exit error.
func (p *runningPipeline) stop(t testing.TB) error {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for {
		if _, ok := p.next(t, 60*time.Second); !ok {
			break
		}
	}
	return p.cmd.Wait()
}

// scrape reads /metrics into metric families by name.
func (p *runningPipeline) scrape(t testing.TB) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return mfs
}

// value is the sum of a family's samples whose labels include want.
func value(mfs map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	var sum float64
	mf := mfs[name]
	if mf == nil {
		return 0
	}
	for _, m := range mf.GetMetric() {
		if hasLabels(m, want) {
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	n := 0
	for _, l := range m.GetLabel() {
		if v, ok := want[l.GetName()]; ok && v == l.GetValue() {
			n++
		}
	}
	return n == len(want)
}

func get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// receive pulls n messages from sub (and acks them).
func receive(t testing.TB, c *pubsub.Client, sub pubsubio.Name, n int) []*pubsub.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var got []*pubsub.Message
	msgs := make(chan *pubsub.Message)
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber(sub.String()).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			select {
			case msgs <- m:
			case <-ctx.Done():
			}
		})
	}()
	for len(got) < n {
		select {
		case m := <-msgs:
			got = append(got, m)
		case <-ctx.Done():
			t.Fatalf("%s: %d of %d messages within 30s", sub.ID, len(got), n)
		}
	}
	cancel()
	<-done
	return got
}

func publish(t testing.TB, c *pubsub.Client, topic pubsubio.Name, data string, attrs map[string]string) string {
	t.Helper()
	pub := c.Publisher(topic.String())
	defer pub.Stop()
	id, err := pub.Publish(context.Background(), &pubsub.Message{Data: []byte(data), Attributes: attrs}).Get(context.Background())
	if err != nil {
		t.Fatalf("publish %q: %v", data, err)
	}
	return id
}

func nowMillis() string { return strconv.FormatInt(time.Now().UnixMilli(), 10) }

func fatalf(t testing.TB, p *runningPipeline, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s\nlog:\n%s", fmt.Sprintf(format, args...), strings.Join(p.log, "\n"))
}
