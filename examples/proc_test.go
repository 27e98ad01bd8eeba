package examples

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// buildDedupflow builds the dedupflow binary the examples run beside.
func buildDedupflow(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dedupflow")
	out, err := exec.Command("go", "build", "-o", bin, "github.com/dedupflow/dedupflow/cmd/dedupflow").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// proc is a process a test started, with its output in one buffer.
type proc struct {
	name   string
	cmd    *exec.Cmd
	out    testenv.Buffer
	exited chan struct{}
	err    error // Wait's result, once exited is closed
}

// start runs name with args and kills it at cleanup if the test has not
// stopped it.
func start(t testing.TB, env []string, name string, args ...string) *proc {
	t.Helper()
	p := &proc{name: filepath.Base(name), cmd: exec.Command(name, args...), exited: make(chan struct{})}
	if len(args) > 0 {
		p.name += " " + args[0]
	}
	p.cmd.Env = append(os.Environ(), env...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
			t.Logf("%s, killed at cleanup:\n%s", p.name, p.out.String())
		}
	})
	return p
}

// waitFor polls the output until re matches within d, and returns re's
// first group.
func (p *proc) waitFor(t testing.TB, re *regexp.Regexp, d time.Duration) string {
	t.Helper()
	deadline := time.After(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		if m := re.FindStringSubmatch(p.out.String()); m != nil {
			return m[1]
		}
		select {
		case <-p.exited:
			if m := re.FindStringSubmatch(p.out.String()); m != nil {
				return m[1]
			}
			t.Fatalf("%s exited (%v) before printing %s:\n%s", p.name, p.err, re, p.out.String())
		case <-deadline:
			t.Fatalf("%s printed no %s in %s:\n%s", p.name, re, d, p.out.String())
		case <-tick.C:
		}
	}
}

// stop sends sig and waits up to 30 s for the process to end, returning
// its exit code.
func (p *proc) stop(t testing.TB, sig syscall.Signal) int {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(30 * time.Second):
		t.Fatalf("%s still running 30 s after %v:\n%s", p.name, sig, p.out.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

var (
	reEmulator = regexp.MustCompile(`export PUBSUB_EMULATOR_HOST=(\S+)`)
	reConsole  = regexp.MustCompile(`Console:\s+(http://\S+)`)
)

// consoleCounts is the part of the console's counts event the tests read.
type consoleCounts struct {
	Received   int64 `json:"received"`
	Emitted    int64 `json:"emitted"`
	Redelivery int64 `json:"redelivery"`
	Republish  int64 `json:"republish"`
}

// waitCounts reads the console's event stream until its counts satisfy ok,
// and returns them; it fails after d.
func waitCounts(t *testing.T, consoleURL string, d time.Duration, ok func(consoleCounts) bool) consoleCounts {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, consoleURL+"/api/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var last consoleCounts
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	counts := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "event: counts":
			counts = true
		case counts && strings.HasPrefix(line, "data: "):
			counts = false
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &last); err != nil {
				t.Fatalf("console counts %q: %v", line, err)
			}
			if ok(last) {
				return last
			}
		}
	}
	t.Fatalf("console counts after %s: %+v (%v)", d, last, sc.Err())
	return last
}
