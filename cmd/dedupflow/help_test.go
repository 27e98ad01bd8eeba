package main

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// buildBinary builds dedupflow once per test run and mode (testenv.Build).
func buildBinary(t *testing.T, race bool) string {
	t.Helper()
	return testenv.Build(t, testenv.DedupflowCommand, race)
}

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// TestHelpExitsZero: -h and --help print the usage and exit 0, for the
// binary and every command; a usage error still exits 2. The help of the
// commands that name the id attribute agrees on its flag and default.
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
	// One flag spelling and one default for the id attribute: what
	// publishers stamp is what up reads; the pipeline reads one when told.
	idFlag := regexp.MustCompile(`\n  -id-attribute string\n[^\n]*\n`)
	for c, dflt := range map[string]string{"publish": `(default "key")`, "loadgen": `(default "key")`, "up": `(default "key")`, "pipeline": ""} {
		_, out := exit(c, "-h")
		line := idFlag.FindString(out)
		if line == "" || (dflt == "") == strings.Contains(line, "(default ") || !strings.Contains(line, dflt) {
			t.Errorf("dedupflow %s -h: --id-attribute %q, want default %q:\n%s", c, line, dflt, out)
		}
	}
	for _, args := range [][]string{nil, {"nosuch"}, {"publish", "--nosuch"}, {"pipeline", "extra"}} {
		if code, out := exit(args...); code != 2 {
			t.Errorf("dedupflow %v: exit %d, want 2:\n%s", args, code, out)
		}
	}
}
