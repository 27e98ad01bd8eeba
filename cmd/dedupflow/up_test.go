package main

import (
	"context"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

var (
	reConsoleURL = regexp.MustCompile(`Console:\s+(http://\S+)`)
	reEmulator   = regexp.MustCompile(`export PUBSUB_EMULATOR_HOST=(\S+)`)
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

// publish publishes ms to up's input topic, as the tutorial's producer
// does, and returns their message IDs.
func (u *upInProcess) publish(t *testing.T, ms ...*pubsub.Message) []string {
	t.Helper()
	ctx := context.Background()
	c, err := pubsub.NewClient(ctx, upDefaultProj, pubsubio.Insecure(u.brokerAddr)...)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	p := c.Publisher(upInputTopic)
	defer p.Stop()
	var ids []string
	for _, m := range ms {
		id, err := p.Publish(ctx, m).Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
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
		// The table sinks, checked as the pipeline checks them.
		{[]string{"--sink", "spanner://projects/p"}, "want spanner://projects/P/instances/I/databases/D"},
		{[]string{"--metadata-columns", "none"}, "--metadata-columns applies to table sinks only, not --sink pubsub"},
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
