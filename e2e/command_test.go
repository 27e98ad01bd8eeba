package e2e

import (
	"os"
	"os/exec"
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
	reBrokerPage = regexp.MustCompile(`# broker page: (http://\S+)`)
)

// command is one run of the dedupflow binary, with what it printed so far.
type command struct {
	name           string
	stdout, stderr *testenv.Buffer
	exited         chan struct{} // closed once the process has exited
	err            error         // its exit, once exited is closed
}

// runCommand starts `dedupflow args...` with its own broker rather than
// one PUBSUB_EMULATOR_HOST names, and at cleanup stops it with Ctrl-C,
// failing the test unless it exits cleanly within 15s.
func runCommand(t *testing.T, args ...string) *command {
	t.Helper()
	cmd := exec.Command(buildBinary(t, raceEnabled), args...)
	cmd.Env = slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "PUBSUB_EMULATOR_HOST=") })
	c := &command{name: "dedupflow " + args[0], stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-c.exited:
			if c.err != nil {
				t.Errorf("%s after Ctrl-C: %v, want exit 0\nstderr:\n%s", c.name, c.err, c.stderr)
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-c.exited
			t.Errorf("%s did not stop within 15s of Ctrl-C\nstderr:\n%s", c.name, c.stderr)
		}
	})
	return c
}

// waitFor polls the command's output until re matches, and returns the
// first group.
func (c *command) waitFor(t *testing.T, what string, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(c.stdout.String()); m != nil {
			return m[1]
		}
		select {
		case <-c.exited:
			t.Fatalf("%s exited (%v) before printing the %s\nstdout:\n%s\nstderr:\n%s", c.name, c.err, what, c.stdout, c.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s printed no %s after 20s\nstdout:\n%s\nstderr:\n%s", c.name, what, c.stdout, c.stderr)
	return ""
}

// up is `dedupflow up` on free ports.
type up struct {
	*command
	consoleURL, brokerAddr string
}

func startUp(t *testing.T, args ...string) *up {
	t.Helper()
	c := runCommand(t, append([]string{"up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0", "--metrics-addr", ""}, args...)...)
	return &up{command: c,
		consoleURL: c.waitFor(t, "console URL", reConsoleURL),
		brokerAddr: c.waitFor(t, "PUBSUB_EMULATOR_HOST line", reEmulator),
	}
}
