package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestNotPubSubServer: every command pointed by PUBSUB_EMULATOR_HOST at a
// port that answers but is no Pub/Sub server (a web server, such as the
// broker's console) fails at start saying so, instead of waiting in
// silence for a minute or until stopped.
func TestNotPubSubServer(t *testing.T) {
	bin := buildBinary(t, false)
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	addr := strings.TrimPrefix(web.URL, "http://")
	for _, args := range [][]string{
		{"publish", "--project", "p", "--topic", "events", "--data", "x"},
		{"subscribe", "--project", "p", "--subscription", "events-sub"},
		{"loadgen", "--project", "p", "--topic", "events", "--count", "10"},
		{"pipeline", "--project", "p", "--input-subscription", "events-sub", "--sink", "stdout", "--metrics-addr", ""},
	} {
		// The deadline only keeps a hang from stalling the run.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "PUBSUB_EMULATOR_HOST=" + addr}
		out, err := cmd.CombinedOutput()
		cancel()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "PUBSUB_EMULATOR_HOST="+addr+" is not a Pub/Sub server") {
			t.Errorf("dedupflow %s with a web server as the emulator: %v, want exit 2 saying it is not a Pub/Sub server:\n%s", args[0], err, out)
		}
	}
}

// TestInterruptWhileServerHangs: Ctrl-C stops a publish whose server took
// its connection and then stopped answering, instead of leaving it to
// wait out the client's 60 s publish timeout.
func TestInterruptWhileServerHangs(t *testing.T) {
	bin := buildBinary(t, false)
	addr := freeAddr(t)
	broker := exec.Command(bin, "broker", "--listen", addr, "--project", "p", "--topic", "events")
	broker.Env = []string{"PATH=/usr/bin:/bin"}
	if err := broker.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = broker.Process.Signal(syscall.SIGCONT)
		_ = broker.Process.Kill()
		_ = broker.Wait()
	}()
	pub := exec.Command(bin, "publish", "--project", "p", "--topic", "events", "--data", "x", "--copies", "1000000")
	pub.Env = []string{"PATH=/usr/bin:/bin", "PUBSUB_EMULATOR_HOST=" + addr}
	stdout, err := pub.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	pub.Stderr = &stderr
	// publish waits for the broker to listen (pubsubio.NewClient).
	if err := pub.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		_ = pub.Process.Kill()
		t.Fatalf("publish printed nothing: %v\n%s", pub.Wait(), &stderr)
	}
	// The broker hangs: its connections stay open, nothing answers.
	if err := broker.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, broker.Process.Pid)
	go func() {
		for lines.Scan() { // keep the pipe drained
		}
	}()
	start := time.Now()
	if err := pub.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- pub.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("publish interrupted: %v, want exit 130\n%s", err, &stderr)
		}
		t.Logf("publish exited %v after SIGINT", time.Since(start).Round(time.Millisecond))
	case <-time.After(30 * time.Second):
		_ = pub.Process.Kill()
		t.Fatalf("publish still runs 30 s after SIGINT, with its server hung")
	}
}

// waitStopped waits until the process pid is stopped (SIGSTOP takes
// effect when the kernel next schedules it): its connections stay open and
// nothing answers on them.
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	stat := fmt.Sprintf("/proc/%d/stat", pid)
	for deadline := time.Now().Add(10 * time.Second); ; {
		b, err := os.ReadFile(stat)
		if err != nil {
			testenv.Cannot(t, "this test reads the process state from /proc: "+err.Error())
		}
		// The state follows the command's name, in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker is not stopped 10 s after SIGSTOP: %s", b)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
