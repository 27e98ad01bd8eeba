package main

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

func lgCollectPlan(t *testing.T, c loadPlanConfig) ([]plannedEvent, planTotals) {
	t.Helper()
	p, err := newLoadPlan(c)
	if err != nil {
		t.Fatal(err)
	}
	var evs []plannedEvent
	for e, ok := p.next(); ok; e, ok = p.next() {
		evs = append(evs, e)
	}
	if _, ok := p.next(); ok {
		t.Fatal("plan goes on after its end")
	}
	return evs, p.totals
}

func TestLoadPlanCounts(t *testing.T) {
	for _, c := range []loadPlanConfig{
		{count: 1000, dupRatio: 0.3, dupCopies: 1, redeliverRatio: 0.05, seed: 1},
		{count: 1000, dupRatio: 0.3, dupCopies: 3, redeliverRatio: 0.05, missingRatio: 0.2, seed: 2},
		{count: 7, dupRatio: 1, dupCopies: 2, redeliverRatio: 1, missingRatio: 0.5, seed: 3},
		{count: 1, dupCopies: 1, seed: 4},
		{count: 10, dupRatio: 0.5, dupCopies: 1, missingRatio: 1, seed: 5},
	} {
		evs, tot := lgCollectPlan(t, c)
		var keyless, republished, copies, redeliver int
		for i, e := range evs {
			if e.seq != i {
				t.Fatalf("event %d has seq %d", i, e.seq)
			}
			if e.keyless {
				keyless++
				if e.copies != 0 {
					t.Errorf("%+v: a keyless event was republished", c)
				}
			}
			if e.copies > 0 {
				republished++
				if e.copies != c.dupCopies {
					t.Errorf("event %d has %d copies, want %d", i, e.copies, c.dupCopies)
				}
			}
			copies += e.copies
			if e.redeliver {
				redeliver++
			}
		}
		want := planTotals{Events: len(evs), Keyless: keyless, Republished: republished, Copies: copies,
			Redeliver: redeliver, Messages: len(evs) + copies}
		if tot != want || len(evs) != c.count {
			t.Errorf("%+v: totals %+v, counted %+v over %d events", c, tot, want, len(evs))
		}
		round := func(r float64, n int) int { return int(r*float64(n) + 0.5) }
		if keyless != round(c.missingRatio, c.count) || redeliver != round(c.redeliverRatio, c.count) ||
			republished != round(c.dupRatio, c.count-keyless) {
			t.Errorf("%+v: %d keyless, %d redeliver, %d republished: not the ratios", c, keyless, redeliver, republished)
		}
	}
}

func TestLoadPlanSeed(t *testing.T) {
	c := loadPlanConfig{count: 500, dupRatio: 0.3, dupCopies: 1, redeliverRatio: 0.1, missingRatio: 0.1, seed: 42}
	a, _ := lgCollectPlan(t, c)
	b, _ := lgCollectPlan(t, c)
	if !reflect.DeepEqual(a, b) {
		t.Error("one seed gave two plans")
	}
	c.seed = 43
	d, _ := lgCollectPlan(t, c)
	if reflect.DeepEqual(a, d) {
		t.Error("seeds 42 and 43 gave the same plan")
	}
	// The shares are spread over the run, not bunched at its start.
	var firstHalf int
	for _, e := range a[:250] {
		if e.copies > 0 {
			firstHalf++
		}
	}
	if firstHalf < 40 || firstHalf > 95 {
		t.Errorf("%d of 135 republished events in the first half, want about 67", firstHalf)
	}
}

func TestLoadPlanInvalid(t *testing.T) {
	for _, tc := range []struct {
		c    loadPlanConfig
		want string
	}{
		{loadPlanConfig{count: 0, dupCopies: 1}, "--count 0"},
		{loadPlanConfig{count: 1, dupRatio: 1.5, dupCopies: 1}, "--dup-ratio 1.5"},
		{loadPlanConfig{count: 1, redeliverRatio: -0.1, dupCopies: 1}, "--redeliver-ratio -0.1"},
		{loadPlanConfig{count: 1, dupCopies: 0}, "--dup-copies 0"},
	} {
		if _, err := newLoadPlan(tc.c); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error about %s", tc.c, err, tc.want)
		}
	}
}

// End to end against pstest: the server holds events + copies messages,
// the id attribute has as many distinct values as keyed events, every
// republished event has its copies under one key, and the summary says so.
func TestLoadgenEndToEnd(t *testing.T) {
	srv := pubServer(t, "load")
	out, errOut, err := pubRun(t, "loadgen", "--project", "test-project", "--topic", "load", "--count", "300",
		"--dup-ratio", "0.3", "--dup-copies", "2", "--redeliver-ratio", "0.1", "--missing-id-ratio", "0.1",
		"--payload-size", "64", "--seed", "7", "--json", "--progress", "lines", "--timestamp-attribute", "ts")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var s loadSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("summary %q: %v", out, err)
	}
	_, tot := lgCollectPlan(t, loadPlanConfig{count: 300, dupRatio: 0.3, dupCopies: 2, redeliverRatio: 0.1, missingRatio: 0.1, seed: 7})
	want := loadSummary{Topic: "projects/test-project/topics/load", IDAttribute: "key", Seed: 7, Complete: true,
		Events: 300, Messages: int64(tot.Messages), Copies: int64(tot.Copies), RepublishedEvents: int64(tot.Republished),
		KeyedEvents: 300 - int64(tot.Keyless), KeylessEvents: int64(tot.Keyless), RedeliverMarked: int64(tot.Redeliver),
		ExpectedUniqueKeys: 300}
	got := s
	got.ElapsedSeconds, got.MessagesPerSecond, got.EventsPerSecond = 0, 0, 0
	if got != want {
		t.Errorf("summary %+v\nwant     %+v", got, want)
	}
	if s.Messages != s.Events+s.Copies || s.KeylessEvents != 30 || s.RepublishedEvents != 81 || s.Copies != 162 {
		t.Errorf("summary arithmetic: %+v", s)
	}

	msgs := srv.Messages()
	if int64(len(msgs)) != s.Messages {
		t.Fatalf("server holds %d messages, summary says %d", len(msgs), s.Messages)
	}
	byKey := map[string][]int{} // key -> copy numbers
	seqs := map[string]bool{}
	var keyless, marked int
	for _, m := range msgs {
		a := m.Attributes
		if len(m.Data) != 64 || !strings.HasPrefix(string(m.Data), "loadgen event "+a[attrSeq]+" ") {
			t.Errorf("message %s data %q", m.ID, m.Data)
		}
		if a["ts"] == "" {
			t.Errorf("message %s has no timestamp", m.ID)
		}
		if a[attrRedeliver] == "1" {
			marked++
		}
		cp, _ := strconv.Atoi(a[attrCopy])
		if cp == 0 {
			seqs[a[attrSeq]] = true
		}
		k, ok := a["key"]
		if !ok {
			keyless++
			continue
		}
		byKey[k] = append(byKey[k], cp)
	}
	if int64(len(byKey)) != s.KeyedEvents || int64(keyless) != s.KeylessEvents || int64(marked) != s.RedeliverMarked || len(seqs) != 300 {
		t.Errorf("%d distinct keys, %d keyless, %d marked, %d events; summary %+v", len(byKey), keyless, marked, len(seqs), s)
	}
	var republished int64
	for k, cps := range byKey {
		switch len(cps) {
		case 1:
		case 3:
			republished++
		default:
			t.Errorf("key %s on %d messages (copies %v), want 1 or 3", k, len(cps), cps)
		}
	}
	if republished != s.RepublishedEvents {
		t.Errorf("%d keys with copies, summary says %d", republished, s.RepublishedEvents)
	}
	if !strings.Contains(errOut, "loadgen: 462/462 messages (100%)") {
		t.Errorf("no final progress line on stderr:\n%s", errOut)
	}
}

func TestLoadgenTextSummaryAndRate(t *testing.T) {
	pubServer(t, "load")
	start := time.Now()
	out, _, err := pubRun(t, "loadgen", "--project", "test-project", "--topic", "load", "--count", "10",
		"--rate", "50", "--progress", "off")
	if err != nil {
		t.Fatal(err)
	}
	// 10 events at 50/s: the last is due 180 ms after the first.
	if d := time.Since(start); d < 180*time.Millisecond {
		t.Errorf("10 events at --rate 50 took %v", d)
	}
	for _, want := range []string{"logical events        10", "messages sent         13 (one per event + 3 republished copies of 3 events)",
		"marked for redelivery 1 (attribute dedupflow_redeliver=1)", "expected unique keys  10", "--seed "} {
		if !strings.Contains(out, want) {
			t.Errorf("summary lacks %q:\n%s", want, out)
		}
	}
}

func TestLoadgenBadFlags(t *testing.T) {
	pubServer(t)
	base := []string{"loadgen", "--project", "test-project", "--topic", "load"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--count", "0"}, "--count 0 must be at least 1"},
		{[]string{"--count", "5", "--dup-ratio", "2"}, "--dup-ratio 2 must be between 0 and 1"},
		{[]string{"--count", "5", "--rate", "-1"}, "--rate -1"},
		{[]string{"--count", "5", "--payload-size", "-1"}, "--payload-size -1"},
		{[]string{"--count", "5", "--progress", "fancy"}, `--progress "fancy"`},
		{[]string{"--count", "5", "--max-in-flight", "0"}, "--max-in-flight 0"},
		{[]string{"--count", "5", "--id-attribute", ""}, "--id-attribute must not be empty"},
	} {
		_, _, err := pubRun(t, append(base, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want an error about %s", tc.args, err, tc.want)
		}
	}
	if _, _, err := pubRun(t, "loadgen", "--count", "5"); err == nil || !strings.Contains(err.Error(), "missing --topic") {
		t.Errorf("no topic: %v", err)
	}
}

// A publish that fails for good stops the run with an error naming the
// event, and the summary still says what got through.
func TestLoadgenStopsOnError(t *testing.T) {
	pubServer(t) // no topic: every publish is NotFound
	out, _, err := pubRun(t, "loadgen", "--project", "test-project", "--topic", "missing", "--count", "50", "--progress", "off", "--json")
	if err == nil || !strings.Contains(err.Error(), "NotFound") || !strings.Contains(err.Error(), "event ") {
		t.Fatalf("error %v, want NotFound naming the event", err)
	}
	var s loadSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil || s.Complete || s.Messages != 0 {
		t.Errorf("summary %q (%v), want an incomplete one with nothing sent", out, err)
	}
}

func TestLineProgressStops(t *testing.T) {
	var mu sync.Mutex
	var b bytes.Buffer
	w := lgWriterFunc(func(p []byte) (int, error) { mu.Lock(); defer mu.Unlock(); return b.Write(p) })
	p := newLineProgress(w, 10, time.Millisecond)
	p.add(4)
	time.Sleep(20 * time.Millisecond)
	p.add(6)
	p.finish(true)
	mu.Lock()
	defer mu.Unlock()
	// Periodic lines while running (their counts depend on scheduling),
	// then one final line after which the ticker is gone.
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	line := regexp.MustCompile(`^loadgen: \d+/10 messages \(\d+%\), \d+ messages/s$`)
	last := lines[len(lines)-1]
	if len(lines) < 2 || !strings.HasPrefix(last, "loadgen: 10/10 messages (100%)") || !strings.HasSuffix(last, ", done") {
		t.Errorf("progress lines:\n%s", b.String())
	}
	for _, l := range lines[:len(lines)-1] {
		if !line.MatchString(l) {
			t.Errorf("progress line %q", l)
		}
	}
}

type lgWriterFunc func([]byte) (int, error)

func (f lgWriterFunc) Write(p []byte) (int, error) { return f(p) }

// The same run against Google's official emulator, read back through a
// subscription: what a pipeline would receive.
func TestLoadgenOfficialEmulator(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", testenv.EmulatorHost(t))
	ctx := context.Background()
	c, err := pubsubio.NewClient(ctx, "test-project")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	id := "loadgen-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := pubsubio.Name{Project: "test-project", Kind: "topics", ID: id}
	sub := pubsubio.Name{Project: "test-project", Kind: "subscriptions", ID: id}
	if err := pubsubio.EnsureTopic(ctx, c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 60); err != nil {
		t.Fatal(err)
	}
	out, errOut, err := pubRun(t, "loadgen", "--project", "test-project", "--topic", id, "--count", "100",
		"--dup-ratio", "0.2", "--missing-id-ratio", "0.1", "--seed", "9", "--json", "--progress", "off")
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut)
	}
	var s loadSummary
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatal(err)
	}
	if s.Messages != 118 || s.Copies != 18 || s.KeylessEvents != 10 {
		t.Fatalf("summary %+v, want 118 messages: 100 events, 18 copies, 10 keyless", s)
	}

	var mu sync.Mutex
	ids := map[string]bool{}
	keys := map[string]int{}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = c.Subscriber(sub.String()).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		defer mu.Unlock()
		if ids[m.ID] {
			return // a redelivery; not what this test counts
		}
		ids[m.ID] = true
		keys[m.Attributes["key"]]++ // keyless ones under ""
		if int64(len(ids)) == s.Messages {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if int64(len(ids)) != s.Messages {
		t.Fatalf("received %d distinct messages, loadgen sent %d", len(ids), s.Messages)
	}
	if keyless := keys[""]; int64(keyless) != s.KeylessEvents || int64(len(keys)-1) != s.KeyedEvents {
		t.Errorf("%d keyless, %d distinct keys; summary %+v", keyless, len(keys)-1, s)
	}
}

// TestLoadgenInterruptedCounts: a loadgen stopped mid-run counts what the
// server holds, the messages in flight at the stop included: its expected
// unique keys are the events of the stored messages.
func TestLoadgenInterruptedCounts(t *testing.T) {
	srv := pubServer(t, "load")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"loadgen", "--project", "test-project", "--topic", "load", "--count", "100000",
			"--dup-ratio", "0.3", "--dup-copies", "2", "--missing-id-ratio", "0.1", "--payload-size", "10",
			"--json", "--progress", "off"}, &out, &errOut)
	}()
	for len(srv.Messages()) < 2000 {
		select {
		case err := <-done:
			t.Fatalf("loadgen ended before the stop: %v\n%s", err, &errOut)
		case <-time.After(5 * time.Millisecond):
		}
	}
	cancel()
	err := <-done
	if err == nil {
		t.Fatal("interrupted loadgen: no error")
	}
	var s loadSummary
	if err := json.Unmarshal(out.Bytes(), &s); err != nil {
		t.Fatalf("summary %q: %v", out.String(), err)
	}
	msgs := srv.Messages()
	events := map[string]bool{}
	for _, m := range msgs {
		events[m.Attributes[attrSeq]] = true
	}
	if s.OutcomeUnknown != 0 || s.Messages != int64(len(msgs)) || s.ExpectedUniqueKeys != int64(len(events)) || s.Complete {
		t.Errorf("summary: %d messages, %d expected unique keys, %d unknown, complete %v; the server holds %d messages of %d events",
			s.Messages, s.ExpectedUniqueKeys, s.OutcomeUnknown, s.Complete, len(msgs), len(events))
	}
}
