package e2e

import (
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
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
	cmd            *exec.Cmd
	stdout, stderr *testenv.Buffer
	exited         chan struct{} // closed once the process has exited
	err            error         // its exit, once exited is closed
	stopOnce       sync.Once
}

// withoutEmulator is the process's environment without PUBSUB_EMULATOR_HOST,
// so that a command uses its own broker rather than one that names.
func withoutEmulator() []string {
	return slices.DeleteFunc(os.Environ(), func(s string) bool { return strings.HasPrefix(s, "PUBSUB_EMULATOR_HOST=") })
}

// runCommand starts `dedupflow args...` with its own broker, and at cleanup
// stops it (stop), unless the test did.
func runCommand(t *testing.T, args ...string) *command {
	t.Helper()
	cmd := exec.Command(buildBinary(t, raceEnabled), args...)
	cmd.Env = withoutEmulator()
	c := &command{name: "dedupflow " + args[0], cmd: cmd, stdout: &testenv.Buffer{}, stderr: &testenv.Buffer{}, exited: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = c.stdout, c.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { c.err = cmd.Wait(); close(c.exited) }()
	t.Cleanup(func() { c.stop(t) })
	return c
}

// stop ends the command with Ctrl-C, failing the test unless it exits
// cleanly within 15s.
func (c *command) stop(t *testing.T) {
	t.Helper()
	c.stopOnce.Do(func() {
		_ = c.cmd.Process.Signal(os.Interrupt)
		select {
		case <-c.exited:
			if c.err != nil {
				t.Errorf("%s after Ctrl-C: %v, want exit 0\nstderr:\n%s", c.name, c.err, c.stderr)
			}
		case <-time.After(15 * time.Second):
			_ = c.cmd.Process.Kill()
			<-c.exited
			t.Errorf("%s did not stop within 15s of Ctrl-C\nstderr:\n%s", c.name, c.stderr)
		}
	})
}

// waitFor polls the command's standard output until re matches, and
// returns the first group.
func (c *command) waitFor(t *testing.T, what string, re *regexp.Regexp) string {
	t.Helper()
	return c.waitIn(t, what, c.stdout, re)
}

// waitForLog is waitFor on the command's standard error, its log.
func (c *command) waitForLog(t *testing.T, what string, re *regexp.Regexp) string {
	t.Helper()
	return c.waitIn(t, what, c.stderr, re)
}

// printBudget is how long a command may take to print what a test waits for:
// a binary built with -race starts slowly on a loaded machine.
const printBudget = time.Minute

func (c *command) waitIn(t *testing.T, what string, out *testenv.Buffer, re *regexp.Regexp) string {
	t.Helper()
	deadline := time.Now().Add(printBudget)
	for time.Now().Before(deadline) {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case <-c.exited:
			t.Fatalf("%s exited (%v) before printing the %s\nstdout:\n%s\nstderr:\n%s", c.name, c.err, what, c.stdout, c.stderr)
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatalf("%s printed no %s after %v\nstdout:\n%s\nstderr:\n%s", c.name, what, printBudget, c.stdout, c.stderr)
	return ""
}

// up is `dedupflow up` on free ports, without metrics unless args (which
// come after those defaults, so a flag given again wins) ask for them.
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
