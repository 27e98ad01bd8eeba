package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestStopWhileStarting: a pipeline told to stop (SIGTERM, Ctrl-C) before
// it has started exits cleanly, as an orchestrator expects of a rollout,
// while a bad flag given with the same stop still fails, and so does a
// publish the stop kept from publishing.
func TestStopWhileStarting(t *testing.T) {
	startInput(t)
	ctx := context.Background()
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	args := []string{"pipeline", "--project", "test", "--metrics-addr", "", "--sink", "stdout", "--input-subscription", "input-sub"}
	var stdout, stderr testenv.Buffer
	if err := run(stopped, args, &stdout, &stderr); err != nil {
		t.Errorf("stopped while starting: %v, want a clean exit", err)
	}
	if err := run(stopped, append(args, "--horizon", "0s"), &stdout, &stderr); err == nil || !strings.Contains(err.Error(), "horizon") {
		t.Errorf("a bad --horizon with a stop: %v, want the flag's error", err)
	}
	// A publish cut short by the stop did not do what it was asked: a
	// script must see that it failed.
	if err := run(stopped, []string{"publish", "--project", "test", "--topic", "input", "--data", "x"}, &stdout, &stderr); err == nil {
		t.Errorf("publish stopped before it published: a clean exit, want an error")
	}
}

// TestStopWhilePubSubDown: a stop (SIGTERM, Ctrl-C) while Pub/Sub is
// unreachable ends the pipeline and subscribe, with an error that says
// why, instead of hanging on a client that keeps reconnecting.
func TestStopWhilePubSubDown(t *testing.T) {
	for _, args := range [][]string{
		{"pipeline", "--project", "test", "--metrics-addr", "", "--sink", "stdout", "--input-subscription", "input-sub"},
		{"subscribe", "--project", "test", "--subscription", "input-sub"},
	} {
		t.Run(args[0], func(t *testing.T) {
			b, c := startInput(t)
			ctx := context.Background()
			rctx, stop := context.WithCancel(ctx)
			defer stop()
			var stdout, stderr testenv.Buffer
			done := make(chan error, 1)
			go func() { done <- run(rctx, args, &stdout, &stderr) }()
			p := c.Publisher("input")
			if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("before the outage")}).Get(ctx); err != nil {
				t.Fatal(err)
			}
			p.Stop()
			for !strings.Contains(stdout.String(), "before the outage") {
				select {
				case err := <-done:
					t.Fatalf("%s ended before the outage: %v\n%s", args[0], err, stderr.String())
				case <-time.After(20 * time.Millisecond):
				}
			}

			_ = b.Close()
			stop()
			select {
			case err := <-done:
				if err != nil && !strings.Contains(err.Error(), "server is unreachable") {
					t.Errorf("%s stopped during the outage with %v, want a clean stop or one saying the server is unreachable", args[0], err)
				}
			case <-time.After(2 * time.Minute):
				t.Fatalf("%s still runs 2 minutes after the stop, with Pub/Sub unreachable", args[0])
			}
		})
	}
}

// TestInterruptedExitCode: Ctrl-C during a loadgen fails it, as a script
// needs to see, with a line that says it was interrupted and the shell's
// code for SIGINT, not "context canceled" and the code of a bad flag.
func TestInterruptedExitCode(t *testing.T) {
	srv := pubServer(t, "load")
	ctx, stop := stopContext()
	defer stop()
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"loadgen", "--project", "test-project", "--topic", "load", "--count", "100000", "--progress", "off"}, &out, &errOut)
	}()
	for len(srv.Messages()) < 100 {
		select {
		case err := <-done:
			t.Fatalf("loadgen ended before the interrupt: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if err == nil || err.Error() != "loadgen interrupted by SIGINT (Ctrl-C) before it finished" || exitCode(err) != 130 {
		t.Errorf("interrupted loadgen: error %v, exit code %d; want it named interrupted by SIGINT, exit 130", err, exitCode(err))
	}
	if !strings.Contains(out.String(), "incomplete") {
		t.Errorf("no incomplete summary:\n%s", &out)
	}
}

// TestVersion: --version names the module version and the Go release.
func TestVersion(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--version"}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if v := out.String(); !strings.HasPrefix(v, "dedupflow ") || !strings.HasSuffix(v, " "+runtime.Version()+"\n") {
		t.Errorf("--version printed %q", v)
	}
}
