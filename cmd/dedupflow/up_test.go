package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
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

var (
	reConsoleURL = regexp.MustCompile(`Console:\s+(http://\S+)`)
	reEmulator   = regexp.MustCompile(`export PUBSUB_EMULATOR_HOST=(\S+)`)
	reMetrics    = regexp.MustCompile(`url=(http://\S+/metrics)`)
)

// waitFor polls out until re matches, and returns the first group.
func waitFor(t *testing.T, what string, out, errs fmt.Stringer, re *regexp.Regexp, exited <-chan struct{}) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case <-exited:
			t.Fatalf("dedupflow up exited before printing the %s\nstdout:\n%s\nstderr:\n%s", what, out, errs)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("no %s after 20s\nstdout:\n%s\nstderr:\n%s", what, out, errs)
	return ""
}

// upInProcess runs `dedupflow up` on free ports inside the test and stops
// it at cleanup, failing the test unless it shuts down cleanly.
type upInProcess struct {
	consoleURL, brokerAddr string
	stdout, stderr         *testenv.Buffer
}

func startUp(t *testing.T, args ...string) *upInProcess {
	t.Helper()
	t.Setenv("PUBSUB_EMULATOR_HOST", "") // the in-process broker, not an outside one
	ctx, cancel := context.WithCancel(context.Background())
	u := &upInProcess{stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}}
	done := make(chan error, 1)
	exited := make(chan struct{})
	all := append([]string{"up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", ""}, args...)
	go func() {
		done <- run(ctx, all, u.stdout, u.stderr)
		close(exited)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("dedupflow up returned %v after Ctrl-C; want a clean stop\nstderr:\n%s", err, u.stderr)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("dedupflow up did not stop within 15s of Ctrl-C\nstderr:\n%s", u.stderr)
		}
	})
	u.consoleURL = waitFor(t, "console URL", u.stdout, u.stderr, reConsoleURL, exited)
	u.brokerAddr = waitFor(t, "PUBSUB_EMULATOR_HOST line", u.stdout, u.stderr, reEmulator, exited)
	return u
}

// TestUpPortInUse: a taken port is a clear error naming the flag, the only
// error up reports, and up leaves nothing running.
func TestUpPortInUse(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken := ln.Addr().String()
	for _, flag := range []string{"--broker-addr", "--console-addr", "--metrics-addr"} {
		t.Run(flag, func(t *testing.T) {
			args := []string{"up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0", flag, taken}
			var stdout, stderr testenv.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := run(ctx, args, &stdout, &stderr)
			if err == nil {
				t.Fatalf("up with %s %s in use: no error", flag, taken)
			}
			if !strings.Contains(err.Error(), flag) || !strings.Contains(err.Error(), "address already in use") {
				t.Errorf("error %q: want it to name %s and say the address is in use", err, flag)
			}
			// The error says it all: stopping what had started is no
			// error of its own.
			if strings.Contains(stderr.String(), "level=ERROR") {
				t.Errorf("an error logged beside the returned one:\n%s", &stderr)
			}
		})
	}
}

// TestUpBadFlags: bad values are refused before anything listens.
func TestUpBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--horizon", "10ms"}, "--horizon"},
		{[]string{"--id-attribute", ""}, "--id-attribute"},
		{[]string{"--project", "x/y"}, "project"},
		{[]string{"--state", "file:x"}, "flag provided but not defined"},
		{[]string{"--horizon", "100000h"}, "--horizon"},
		{[]string{"extra"}, "unexpected argument"},
		// The console advises --audit-horizon: up takes it, checked as the pipeline checks it.
		{[]string{"--audit-horizon", "1m"}, "--audit-horizon 1m0s must be longer than --horizon 10m0s"},
	} {
		var stdout, stderr testenv.Buffer
		args := append([]string{"up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}, tc.args...)
		// A case that is not refused runs until the timeout, then fails.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := run(ctx, args, &stdout, &stderr)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("up %v: error %v, want one mentioning %q", tc.args, err, tc.want)
		}
	}
}

// TestUpAuditHorizon: up runs its pipeline with the audit the console's
// advice names.
func TestUpAuditHorizon(t *testing.T) {
	up := startUp(t, "--audit-horizon", "7d")
	if !strings.Contains(up.stderr.String(), "audit horizon on") || !strings.Contains(up.stderr.String(), "audit_horizon=168h0m0s") {
		t.Errorf("up --audit-horizon 7d: no audit in its log:\n%s", up.stderr)
	}
}

// TestUpBinary runs the tutorial from the built binary: `dedupflow up`,
// `dedupflow publish` as the producer, `dedupflow subscribe` as the
// consumer app, then Ctrl-C.
func TestUpBinary(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, raceEnabled)
	env := slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "PUBSUB_EMULATOR_HOST=") })

	up := exec.Command(bin, "up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	up.Env = env
	var stdout, stderr testenv.Buffer
	up.Stdout, up.Stderr = &stdout, &stderr
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = up.Wait(); close(exited) }()
	defer func() {
		select {
		case <-exited:
		default:
			up.Process.Kill()
			<-exited
		}
	}()
	addr := waitFor(t, "PUBSUB_EMULATOR_HOST line", &stdout, &stderr, reEmulator, exited)
	consoleURL := waitFor(t, "console URL", &stdout, &stderr, reConsoleURL, exited)
	metricsURL := waitFor(t, "metrics URL", &stderr, &stdout, reMetrics, exited)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// dedupflow runs as another client of the broker would, through
	// PUBSUB_EMULATOR_HOST as printed.
	dedupflow := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = append(env, "PUBSUB_EMULATOR_HOST="+addr)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Fatalf("dedupflow %v: %v\n%s", args, err, errb.String())
		}
		return out.String()
	}
	publish := func(data, key string) {
		t.Helper()
		dedupflow("publish", "--project", "dedupflow-demo", "--topic", "topicToDataflow",
			"--data", data, "--key", key)
	}
	// The seed tutorial: Message 2, 3 and 4 share key 456. They are
	// published by the command the banner prints, pasted into a shell as a
	// user would: it must stamp the key where up looks for it.
	publish("Message 1", "123")
	m := regexp.MustCompile(`(?m)^\s+(dedupflow publish .*)$`).FindStringSubmatch(stdout.String())
	if m == nil {
		t.Fatalf("no publish command in the banner:\n%s", &stdout)
	}
	sh := exec.CommandContext(ctx, "sh", "-c", m[1])
	sh.Env = append(env, "PUBSUB_EMULATOR_HOST="+addr, "PATH="+filepath.Dir(bin)+":"+os.Getenv("PATH"))
	if out, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", m[1], err, out)
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
	waitMetrics(t, metricsURL, map[string]string{
		`dedupflow_received_total`:                                "4",
		`dedupflow_messages_total{outcome="emitted"}`:             "2",
		`dedupflow_messages_total{outcome="duplicate_republish"}`: "2",
		// The broker's side of the same: the pipeline's input drained.
		`dedupflow_broker_undelivered_messages{subscription="projects/` + upDefaultProj + `/subscriptions/` + upPipelineSub + `"}`: "0",
		`dedupflow_broker_unacked_messages{subscription="projects/` + upDefaultProj + `/subscriptions/` + upPipelineSub + `"}`:     "0",
	})

	publish("Message 5", "789")
	if out, want := subscribe("--count", "1"), "Received message: \"Message 5\".\n"; out != want {
		t.Errorf("subscribe text: %q, want %q", out, want)
	}
	if resp, err := http.Get(consoleURL); err != nil || resp.StatusCode != 200 {
		t.Errorf("console %s: %v %v", consoleURL, resp, err)
	} else {
		resp.Body.Close()
	}

	if err := up.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("dedupflow up after Ctrl-C: %v, want exit 0\nstderr:\n%s", waitErr, &stderr)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("dedupflow up still running 15s after Ctrl-C\nstderr:\n%s", &stderr)
	}
	if !strings.Contains(stderr.String(), "pipeline stopped") {
		t.Errorf("no clean pipeline stop in the log:\n%s", &stderr)
	}
}

// waitMetrics polls /metrics until every series has its value.
func waitMetrics(t *testing.T, url string, want map[string]string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		last = string(b)
		ok := true
		for series, v := range want {
			ok = ok && strings.Contains(last, "\n"+series+" "+v+"\n")
		}
		if ok {
			return
		}
	}
	t.Fatalf("metrics never reached %v; last:\n%s", want, last)
}
