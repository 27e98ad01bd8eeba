package broker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// emulatorLacks names the sections of testdata/python/transcript.txt that
// Google's emulator does not act out: it accepts the seeks but replays
// nothing, so its transcript there is only compared by the test's log.
var emulatorLacks = map[string]bool{"== seek to a snapshot and to a time": true}

// TestPythonClientTour runs testdata/python/client_tour.py with the official
// Python client, over gRPC and over its REST transport, against our broker
// and against Google's emulator: ours must print
// testdata/python/transcript.txt exactly, the emulator every section it
// supports.
func TestPythonClientTour(t *testing.T) {
	t.Parallel()
	for _, transport := range []string{"grpc", "rest"} {
		t.Run(transport, func(t *testing.T) { pythonClientTour(t, transport) })
	}
}

func pythonClientTour(t *testing.T, transport string) {
	python := testenv.Python(t)
	dir, err := filepath.Abs(filepath.Join("..", "testdata", "python"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, "transcript.txt"))
	if err != nil {
		t.Fatal(err)
	}
	wantSections := sections(string(want))
	testenv.EmulatorAndOurs(t, func(t *testing.T) string {
		return startOurs(t, Options{Now: time.Now}).addr
	}, func(t *testing.T, host string) {
		emulator := strings.HasSuffix(t.Name(), "/emulator")
		got := sections(runTour(t, python, filepath.Join(dir, "client_tour.py"), host, transport))
		for _, name := range sectionNames(string(want)) {
			if emulator && emulatorLacks[name] {
				t.Logf("the emulator, not compared:\n%s", got[name])
				continue
			}
			if got[name] != wantSections[name] {
				t.Errorf("%s:\ngot\n%s\nwant\n%s", name, got[name], wantSections[name])
			}
		}
	})
}

func runTour(t *testing.T, python, script, host, transport string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, script)
	cmd.Env = append(os.Environ(),
		"PUBSUB_EMULATOR_HOST="+host,
		"TOUR_TRANSPORT="+transport,
		fmt.Sprintf("TOUR_SUFFIX=%d", time.Now().UnixNano()))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("client_tour.py: %v\n%s%s", err, out, stderr.String())
	}
	return string(out)
}

// sections splits a transcript at its "== name" lines.
func sections(transcript string) map[string]string {
	m := map[string]string{}
	name := ""
	for _, line := range strings.SplitAfter(transcript, "\n") {
		if strings.HasPrefix(line, "== ") {
			name = strings.TrimSpace(line)
			continue
		}
		m[name] += line
	}
	return m
}

func sectionNames(transcript string) []string {
	var names []string
	for _, line := range strings.Split(transcript, "\n") {
		if strings.HasPrefix(line, "== ") {
			names = append(names, line)
		}
	}
	return names
}
