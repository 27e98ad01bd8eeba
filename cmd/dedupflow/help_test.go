package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// binaries holds dedupflow built once per test run and mode, since tests run
// in parallel and each link takes seconds; TestMain removes its folder.
var binaries struct {
	sync.Mutex
	dir   string
	built map[bool]string
}

// buildBinary builds dedupflow, with -race when race is set: as this test
// binary was built (raceEnabled), the packages it compiled are reused and
// only dedupflow's own package and the link are new; a binary a test kills
// is built without it. Tests share the build; none may change the file.
func buildBinary(t *testing.T, race bool) string {
	t.Helper()
	binaries.Lock()
	defer binaries.Unlock()
	if bin, ok := binaries.built[race]; ok {
		return bin
	}
	name := "dedupflow"
	args := []string{"build"}
	if race {
		name += "-race"
		args = append(args, "-race")
	}
	bin := filepath.Join(binaries.dir, name)
	build := exec.Command("go", append(args, "-o", bin, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if binaries.built == nil {
		binaries.built = map[bool]string{}
	}
	binaries.built[race] = bin
	return bin
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dedupflow-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binaries.dir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// TestHelpExitsZero: -h and --help print the usage and exit 0, for the
// binary and every command; a usage error still exits 2.
func TestHelpExitsZero(t *testing.T) {
	t.Parallel()
	bin := buildBinary(t, raceEnabled)
	exit := func(args ...string) (int, string) {
		t.Helper()
		cmd := exec.Command(bin, args...)
		cmd.Env = []string{"PATH=/usr/bin:/bin"} // no DEDUPFLOW_* or credentials from the caller
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode(), string(out)
		}
		if err != nil {
			t.Fatalf("dedupflow %v: %v", args, err)
		}
		return 0, string(out)
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		if code, out := exit(args...); code != 0 || !strings.Contains(out, "usage: dedupflow COMMAND") {
			t.Errorf("dedupflow %v: exit %d, want 0 with the usage:\n%s", args, code, out)
		}
	}
	for _, c := range commands() {
		for _, h := range []string{"-h", "--help"} {
			code, out := exit(c.name, h)
			if code != 0 || !strings.Contains(strings.ToLower(out), "usage") || !strings.Contains(out, "\n  -") {
				t.Errorf("dedupflow %s %s: exit %d, want 0 with its flags:\n%s", c.name, h, code, out)
			}
		}
	}
	for _, args := range [][]string{nil, {"nosuch"}, {"publish", "--nosuch"}, {"pipeline", "extra"}} {
		if code, out := exit(args...); code != 2 {
			t.Errorf("dedupflow %v: exit %d, want 2:\n%s", args, code, out)
		}
	}
}
