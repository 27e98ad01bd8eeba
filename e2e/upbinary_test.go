package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

var reMetrics = regexp.MustCompile(`url=(http://\S+)/metrics`)

// TestUpBinary runs the tutorial from the built binary: `dedupflow up`,
// `dedupflow publish` as the producer, `dedupflow subscribe` as the
// consumer app, then Ctrl-C.
func TestUpBinary(t *testing.T) {
	t.Parallel()
	up := startUp(t, "--metrics-addr", "127.0.0.1:0")
	metricsBase := up.waitForLog(t, "metrics URL", reMetrics)
	bin := buildBinary(t, raceEnabled)
	env := append(withoutEmulator(), "PUBSUB_EMULATOR_HOST="+up.brokerAddr)

	// Each command has a budget of its own, so that on a loaded machine one
	// slow start does not eat the next command's time; one that runs out of
	// it is named as such.
	const budget = time.Minute
	overBudget := func(ctx context.Context) string {
		if ctx.Err() != nil {
			return fmt.Sprintf(" (not done within %v)", budget)
		}
		return ""
	}
	// dedupflow runs as another client of the broker would, through
	// PUBSUB_EMULATOR_HOST as printed.
	dedupflow := func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("dedupflow %v: %v%s\n%s", args, err, overBudget(ctx), errb.String())
		}
		return out.String()
	}
	publish := func(data, key string) {
		t.Helper()
		dedupflow("publish", "--project", "dedupflow-demo", "--topic", "topicToDataflow",
			"--data", data, "--key", key)
	}
	// The tutorial: Message 2, 3 and 4 share key 456. They are
	// published by the command the banner prints, pasted into a shell as a
	// user would: it must stamp the key where up looks for it.
	publish("Message 1", "123")
	m := regexp.MustCompile(`(?m)^\s+(dedupflow publish .*)$`).FindStringSubmatch(up.stdout.String())
	if m == nil {
		t.Fatalf("no publish command in the banner:\n%s", up.stdout)
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	sh := exec.CommandContext(ctx, "sh", "-c", m[1])
	sh.Env = append(env, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v%s\n%s", m[1], err, overBudget(ctx), out)
	}

	subscribe := func(args ...string) string {
		t.Helper()
		return dedupflow(append([]string{"subscribe", "--project", "dedupflow-demo",
			"--subscription", "topicFromDataflow.subscriptionFromDataflow"}, args...)...)
	}
	var got []string
	sc := bufio.NewScanner(strings.NewReader(subscribe("--json", "--count", "2")))
	for sc.Scan() {
		var m struct {
			Data        string            `json:"data"`
			Attributes  map[string]string `json:"attributes"`
			MessageID   string            `json:"message_id"`
			PublishTime time.Time         `json:"publish_time"`
		}
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("subscribe --json line %q: %v", sc.Text(), err)
		}
		if m.MessageID == "" || m.PublishTime.IsZero() {
			t.Errorf("line %q: want a message ID and a publish time", sc.Text())
		}
		got = append(got, m.Data+"/"+m.Attributes["key"])
	}
	slices.Sort(got)
	if want := []string{"Message 1/123", "Message 2/456"}; !slices.Equal(got, want) {
		t.Errorf("through the pipeline: %q, want %q", got, want)
	}
	// Exactly those two: all four were received, two emitted, two dropped
	// as republished copies.
	const pipelineSub = `{subscription="projects/dedupflow-demo/subscriptions/topicToDataflow.dedupflow"}`
	testenv.WaitMetrics(t, metricsBase, map[string]float64{
		`dedupflow_received_total`:                                4,
		`dedupflow_messages_total{outcome="emitted"}`:             2,
		`dedupflow_messages_total{outcome="duplicate_republish"}`: 2,
		// The broker's side of the same: the pipeline's input drained.
		`dedupflow_broker_undelivered_messages` + pipelineSub: 0,
		`dedupflow_broker_unacked_messages` + pipelineSub:     0,
	})

	publish("Message 5", "789")
	if out, want := subscribe("--count", "1"), "Received message: \"Message 5\".\n"; out != want {
		t.Errorf("subscribe text: %q, want %q", out, want)
	}
	testenv.Get(t, up.consoleURL)

	up.stop(t)
	if !strings.Contains(up.stderr.String(), "pipeline stopped") {
		t.Errorf("no clean pipeline stop in the log:\n%s", up.stderr)
	}
}
