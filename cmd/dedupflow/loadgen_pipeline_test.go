package main

import (
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

var seriesLine = regexp.MustCompile(`(?m)^(dedupflow_(?:received_total|messages_total\{outcome="(\w+)"\})) (\S+)$`)

// scrapeOutcomes reads the pipeline's counters from /metrics.
func scrapeOutcomes(t *testing.T, url string) map[string]float64 {
	t.Helper()
	got := map[string]float64{}
	for _, m := range seriesLine.FindAllStringSubmatch(testenv.Get(t, url), -1) {
		v, _ := strconv.ParseFloat(m[3], 64)
		name := m[2]
		if name == "" {
			name = "received"
		}
		got[name] = v
	}
	return got
}

// loadgen drives the pipeline: what it emits is what loadgen says a correct
// pipeline must emit, and the outcomes add up to what it received.
func TestLoadgenThroughPipeline(t *testing.T) {
	_, c := startBroker(t, "test-project")
	ctx := context.Background()
	for _, id := range []string{"events", "deduped"} {
		if err := pubsubio.EnsureTopic(ctx, c, pubsubio.Name{Project: "test-project", Kind: "topics", ID: id}); err != nil {
			t.Fatal(err)
		}
	}
	in := pubsubio.Name{Project: "test-project", Kind: "subscriptions", ID: "events-dedup"}
	if err := pubsubio.EnsureSubscription(ctx, c, in, pubsubio.Name{Project: "test-project", Kind: "topics", ID: "events"}, 30); err != nil {
		t.Fatal(err)
	}
	metricsAddr := freeAddr(t)

	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- run(pctx, []string{"pipeline", "--project", "test-project", "--input-subscription", "events-dedup",
			"--output-topic", "deduped", "--id-attribute", "key", "--producer-attribute", "dedupflow_seq",
			"--metrics-addr", metricsAddr, "--log-level", "warn"}, io.Discard, io.Discard)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v", err)
		}
	}()

	out, errOut, err := pubRun(t, "loadgen", "--project", "test-project", "--topic", "events", "--count", "3000",
		"--dup-ratio", "0.3", "--dup-copies", "2", "--missing-id-ratio", "0.05", "--seed", "11", "--json", "--progress", "off")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, errOut)
	}
	var s loadSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	url := "http://" + metricsAddr + "/metrics"
	var m map[string]float64
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		m = scrapeOutcomes(t, url)
		settled := m["emitted"] + m["duplicate_republish"] + m["duplicate_redelivery"] + m["dead_lettered"]
		if settled >= float64(s.Messages) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline settled %v of %d messages; metrics %v", settled, s.Messages, m)
		}
	}
	time.Sleep(300 * time.Millisecond) // anything extra would show now
	m = scrapeOutcomes(t, url)
	if m["emitted"] != float64(s.ExpectedUniqueKeys) {
		t.Errorf("emitted %v, loadgen expects %d unique keys", m["emitted"], s.ExpectedUniqueKeys)
	}
	if m["duplicate_republish"] != float64(s.Copies) {
		t.Errorf("republishes %v, loadgen sent %d copies", m["duplicate_republish"], s.Copies)
	}
	var sum float64
	for k, v := range m {
		if k != "received" {
			sum += v
		}
	}
	if sum != m["received"] {
		t.Errorf("outcomes add up to %v, received %v: %v", sum, m["received"], m)
	}
	if s.KeylessEvents == 0 {
		t.Fatal("the run had no keyless events; the missing-id path went untested")
	}
	// The batch receiver's own counters: its two streams, opened once
	// each, and no ack refused on a subscription without exactly-once.
	all, err := testenv.Scrape("http://" + metricsAddr)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]float64{"dedupflow_streams_opened_total": 2, "dedupflow_invalid_acks_total": 0} {
		if got, ok := all[name]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", name, got, ok, want)
		}
	}
}
