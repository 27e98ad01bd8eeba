package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// The flags of keys from the body, event time and the audit horizon.
func TestEventAndAuditFlags(t *testing.T) {
	base := []string{"--input-subscription", "projects/p/subscriptions/sub", "--output-topic", "projects/p/topics/out"}
	cases := []struct {
		args []string
		err  string
		ok   func(t *testing.T, c jobConfig)
	}{
		{args: []string{"--key-from", "json:order.id", "--time-domain", "event", "--allowed-lateness", "2m",
			"--audit-horizon", "7d", "--audit-fp", "0.01", "--audit-capacity", "1000", "--state", "file:/var/lib/d/state.db"},
			ok: func(t *testing.T, c jobConfig) {
				cfg, opt := c.pipeline, c.pipeline.Policy
				if opt.From != dedup.KeyFromJSON || opt.Path != "order.id" || opt.TimeDomain != dedup.EventTime ||
					opt.AllowedLateness != 2*time.Minute || cfg.Audit.Horizon != 7*24*time.Hour || cfg.Audit.FalsePositive != 0.01 ||
					cfg.Audit.Capacity != 1000 || cfg.AuditFile != "/var/lib/d/state.db.audit" {
					t.Fatalf("config %+v, options %+v", cfg, opt)
				}
			}},
		{args: []string{"--key-from", "hash", "--missing-id", "pass"}, ok: func(t *testing.T, c jobConfig) {
			if cfg := c.pipeline; c.pipeline.From != dedup.KeyFromHash || cfg.Audit.Horizon != 0 {
				t.Fatalf("%+v", cfg)
			}
		}},
		{args: []string{"--key-from", "json:"}, err: "path is empty"},
		{args: []string{"--key-from", "xml:a"}, err: "attribute, json:PATH or hash"},
		{args: []string{"--key-from", "json:order..id["}, err: `--key-from: JSON path "order..id[": empty name before '.'`},
		{args: []string{"--key-from", "hash", "--id-attribute", "k"}, err: "--output-id-attribute"},
		{args: []string{"--time-domain", "ingest"}, err: "processing or event"},
		{args: []string{"--late", "dead-letter", "--time-domain", "event"}, err: "--dead-letter-topic"},
		{args: []string{"--late", "dead-letter", "--dead-letter-topic", "projects/p/topics/dead"}, err: "--time-domain event"},
		{args: []string{"--late", "drop"}, err: "pass or dead-letter"},
		{args: []string{"--allowed-lateness", "-1s", "--time-domain", "event"}, err: "negative"},
		{args: []string{"--audit-horizon", "5m"}, err: "longer than --horizon"},
		{args: []string{"--audit-horizon", "7d", "--audit-fp", "0.9"}, err: "between 0 and 0.5"},
		{args: []string{"--audit-horizon", "7d", "--audit-capacity", "100000000000"}, err: "more than the"},
		{args: []string{"--audit-horizon", "week"}, err: "ms, s, m, h or d"},
	}
	for _, c := range cases {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var j jobFlags
			fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			j.register(fs)
			err := fs.Parse(append(append([]string{}, base...), c.args...))
			var cfg jobConfig
			if err == nil {
				cfg, err = j.config()
			}
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			c.ok(t, cfg)
		})
	}
}

// TestDurationFlags: every duration flag takes days, as --audit-horizon
// does, and a bad duration is one line naming the units, not the usage.
func TestDurationFlags(t *testing.T) {
	base := []string{"pipeline", "--input-subscription", "projects/p/subscriptions/sub", "--output-topic", "projects/p/topics/out", "--state", "file:/nonexistent/x"}
	for _, args := range [][]string{
		{"--horizon", "2d", "--audit-horizon", "7d"},
		{"--time-domain", "event", "--allowed-lateness", "0.5d"},
	} {
		var j jobFlags
		fs := newFlags("pipeline", io.Discard)
		j.register(fs)
		if err := parse(fs, append(append([]string{}, base[1:]...), args...)); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
	for _, cmd := range []string{"pipeline", "up"} {
		var stdout, stderr strings.Builder
		err := run(t.Context(), []string{cmd, "--horizon", "7x"}, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), "ms, s, m, h or d") {
			t.Errorf("%s --horizon 7x: %v, want an error naming the units", cmd, err)
		}
		if stderr.Len() > 0 {
			t.Errorf("%s --horizon 7x printed more than the error:\n%s", cmd, stderr.String())
		}
	}
}

// TestUnreadVariableWarned: a DEDUPFLOW_* variable that no flag of the
// command reads is named in a warning with the nearest one a flag reads;
// the command's own variables and the tests' are not.
func TestUnreadVariableWarned(t *testing.T) {
	t.Setenv("DEDUPFLOW_STAT", "redis://:pw@x:6379/0")
	t.Setenv("DEDUPFLOW_HORIZON", "2m")
	t.Setenv("DEDUPFLOW_REDIS_URL", "redis://127.0.0.1:1/0")
	var stderr strings.Builder
	err := run(t.Context(), []string{"pipeline", "--sink", "stdout"}, io.Discard, &stderr)
	if err == nil || !strings.Contains(err.Error(), "missing input") {
		t.Fatalf("pipeline without input: %v", err)
	}
	log := stderr.String()
	if !strings.Contains(log, "variable=DEDUPFLOW_STAT nearest=DEDUPFLOW_STATE") {
		t.Errorf("no warning naming DEDUPFLOW_STAT and DEDUPFLOW_STATE:\n%s", log)
	}
	if strings.Contains(log, "DEDUPFLOW_HORIZON") || strings.Contains(log, "DEDUPFLOW_REDIS_URL") || strings.Contains(log, "pw@") {
		t.Errorf("warned about a variable the command or the tests read, or showed a value:\n%s", log)
	}
}

// TestTestVariablesKnown: every DEDUPFLOW_* variable scripts/test.sh
// exports is one the commands know for a test's, so a command run by a
// test never warns about CI's own environment (a new variable once made
// the outage tests see a warning they count).
func TestTestVariablesKnown(t *testing.T) {
	script, err := os.ReadFile(filepath.Join("..", "..", "scripts", "test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range regexp.MustCompile(`export (DEDUPFLOW_[A-Z0-9_]+)=`).FindAllStringSubmatch(string(script), -1) {
		if !slices.Contains(testVariables, m[1]) {
			t.Errorf("scripts/test.sh exports %s, which testVariables (common.go) lacks", m[1])
		}
	}
}
