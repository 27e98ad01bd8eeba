package main

import (
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildBinary builds dedupflow, with -race when race is set: as this test
// binary was built (raceEnabled), the packages it compiled are reused and
// only dedupflow's own package and the link are new; a binary a test kills
// is built without it.
func buildBinary(t *testing.T, race bool) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "dedupflow")
	args := []string{"build", "-o", bin}
	if race {
		args = append(args, "-race")
	}
	build := exec.Command("go", append(args, ".")...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// TestHelpExitsZero: -h and --help print the usage and exit 0, for the
// binary and every command; a usage error still exits 2.
func TestHelpExitsZero(t *testing.T) {
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
