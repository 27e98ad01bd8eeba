package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

func TestPlanIsExactAndCopiesFollowOriginals(t *testing.T) {
	for _, ratio := range []float64{0, 0.1, 0.3, 0.6, 1} {
		wl := workload{events: 5000, dupRatio: ratio, redeliverRatio: 0.02, spread: 100, seed: 7, keyPrefix: "t"}
		msgs := wl.plan()
		total, copies, redeliver := counts(msgs)
		wantCopies := int(ratio*5000 + 0.5)
		if total != 5000+wantCopies || copies != wantCopies || redeliver != 100 {
			t.Fatalf("ratio %v: %d messages, %d copies, %d redeliveries; want %d, %d, 100", ratio, total, copies, redeliver, 5000+wantCopies, wantCopies)
		}
		firstAt := map[int]int{}
		for i, m := range msgs {
			if m.copy == 0 {
				if _, dup := firstAt[m.event]; dup {
					t.Fatalf("event %d published twice as an original", m.event)
				}
				firstAt[m.event] = i
			}
		}
		originals := 0 // originals published so far
		for i, m := range msgs {
			if m.copy == 0 {
				originals++
			} else {
				// The copy comes after its original, within spread further originals.
				if f, ok := firstAt[m.event]; !ok || f > i || originals-1-m.event > wl.spread {
					t.Fatalf("ratio %v: copy of event %d at %d after %d originals, original at %d (ok %v)", ratio, m.event, i, originals, f, ok)
				}
				if m.redeliver {
					t.Fatalf("a copy is marked for redelivery")
				}
			}
		}
		if len(firstAt) != 5000 {
			t.Fatalf("%d originals for 5000 events", len(firstAt))
		}
	}
}

func TestPlanIsReproducible(t *testing.T) {
	a := workload{events: 1000, dupRatio: 0.3, redeliverRatio: 0.02, spread: 50, seed: 3}.plan()
	b := workload{events: 1000, dupRatio: 0.3, redeliverRatio: 0.02, spread: 50, seed: 3}.plan()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("message %d differs: %+v vs %+v", i, a[i], b[i])
		}
	}
}

func TestVerifyOutputs(t *testing.T) {
	wl := workload{events: 3, keyPrefix: "k"}
	ok := map[string]int{"k-0": 1, "k-1": 1, "k-2": 1}
	if _, err := verifyOutputs(wl, ok, 0, false); err != nil {
		t.Fatalf("correct outputs rejected: %v", err)
	}
	for name, c := range map[string]struct {
		seen    map[string]int
		unknown int
	}{
		"leaked duplicate": {map[string]int{"k-0": 2, "k-1": 1, "k-2": 1}, 0},
		"lost event":       {map[string]int{"k-0": 1, "k-2": 1}, 0},
		"stranger key":     {map[string]int{"k-0": 1, "k-1": 1, "k-2": 1, "x": 1}, 0},
		"keyless output":   {ok, 1},
	} {
		var ce *correctnessError
		if _, err := verifyOutputs(wl, c.seen, c.unknown, false); !errors.As(err, &ce) {
			t.Errorf("%s: got %v, want a correctness error", name, err)
		}
	}
	// The relay floor is not crash-safe: its copies are counted, but a
	// lost event still fails.
	if n, err := verifyOutputs(wl, map[string]int{"k-0": 2, "k-1": 1, "k-2": 3}, 0, true); err != nil || n != 2 {
		t.Errorf("leaky consumer with 2 keys emitted twice: %d, %v", n, err)
	}
	var ce *correctnessError
	if _, err := verifyOutputs(wl, map[string]int{"k-0": 2, "k-2": 1}, 0, true); !errors.As(err, &ce) {
		t.Errorf("leaky consumer that lost an event: got %v, want a correctness error", err)
	}
}

func TestMedianAndNumbers(t *testing.T) {
	if m := (row{values: []float64{3, 1, 2}}).median(); m != 2 {
		t.Errorf("median of 3,1,2 = %v", m)
	}
	if m := (row{values: []float64{4, 1, 3, 2}}).median(); m != 2.5 {
		t.Errorf("median of 4,1,3,2 = %v", m)
	}
	for v, want := range map[float64]string{1234567: "1,234,567", 999.94: "999.9", -12345: "-12,345", 30.25: "30.2"} {
		if got := num(v); got != want {
			t.Errorf("num(%v) = %q, want %q", v, got, want)
		}
	}
}

// The hand-kept component measurements are in every report, as they are.
func TestReportCarriesNotes(t *testing.T) {
	md := (&env{}).markdown()
	if !strings.Contains(md, "## Component measurements\n\n"+notes) || !strings.Contains(notes, "### Disk store") {
		t.Fatal("the report does not carry bench/notes.md under Component measurements")
	}
}

// A partial run keeps the earlier rows it did not measure again, names
// their run, and takes no ratio across runs.
func TestSettleKeepsEarlierRows(t *testing.T) {
	e := &env{machine: machine{cpu: "now", cores: 2, goVer: "go"}}
	e.earlier = []earlier{{Date: "old", Machine: machineJSON{"then", 2, "go"}}, {Date: "older", Machine: machineJSON{"gone", 2, "go"}}}
	e.kept = []row{
		{section: "pipeline", group: "0% copies", name: nameMem, values: []float64{1}, from: 1},
		{section: "pipeline", group: "30% copies", name: nameMem, values: []float64{2}, from: 1},
		{section: "pipeline", group: "30% copies", name: nameBento, values: []float64{3}, from: 1},
		{section: "memory", group: "x", name: "only in the oldest", values: []float64{4}, from: 2},
	}
	e.rows = []row{{section: "pipeline", group: "30% copies", name: nameMem, peer: nameBento, values: []float64{5}}}
	e.settle()
	var got []string
	for _, r := range e.rows {
		got = append(got, r.group+"/"+r.name+"/"+e.machineOf(r))
	}
	want := []string{"0% copies/" + nameMem + "/then ×2, go, run A", "30% copies/" + nameMem + "/now ×2, go, this run",
		"30% copies/" + nameBento + "/then ×2, go, run A", "x/only in the oldest/gone ×2, go, run B"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("rows after settle:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if r, _ := e.find("pipeline", "30% copies", nameMem); !strings.Contains(e.ratio(r), "measured in another run") {
		t.Errorf("ratio across runs: %q", e.ratio(r))
	}
}

func TestParseInfo(t *testing.T) {
	info := "# Stats\r\ntotal_commands_processed:1200\r\ntotal_reads_processed:40\r\ntotal_net_input_bytes:9000\r\n" +
		"total_net_output_bytes:700\r\n# Memory\r\nused_memory:123456\r\n# Commandstats\r\n" +
		"cmdstat_set:calls=1100,usec=900,usec_per_call=0.82,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_info:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n# Keyspace\r\ndb0:keys=500,expires=500,avg_ttl=599000\r\n"
	s := parseInfo(info)
	if s.commands != 1200 || s.reads != 40 || s.netIn != 9000 || s.netOut != 700 || s.usedMemory != 123456 || s.keys != 500 ||
		s.calls["set"] != 1100 || s.calls["info"] != 3 {
		t.Fatalf("parsed %+v", s)
	}
	d := s.sub(parseInfo("total_commands_processed:200\r\ncmdstat_set:calls=100,usec=1\r\n"))
	if d.commands != 1000 || d.calls["set"] != 1000 {
		t.Fatalf("difference %+v", d)
	}
}

// TestSoakRunsOnDemand: the soak takes minutes, so a run without --only
// leaves it out; --only soak runs it at full size, --quick runs it short.
func TestSoakRunsOnDemand(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
		keys int
	}{
		{nil, false, 1_000_000},
		{[]string{"--only", "pipeline"}, false, 1_000_000},
		{[]string{"--only", "soak"}, true, 1_000_000},
		{[]string{"--quick"}, true, 20_000},
		{[]string{"--only", "soak", "--soak-keys", "5000"}, true, 5000},
	} {
		c, err := parseConfig(tc.args, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		e := &env{cfg: c}
		if got := e.wants("soak"); got != tc.want || c.soakKeys != tc.keys {
			t.Errorf("%v: soak runs %v with %d keys, want %v with %d", tc.args, got, c.soakKeys, tc.want, tc.keys)
		}
		if len(tc.args) == 0 && !e.wants("pipeline") {
			t.Errorf("a run without --only leaves out the pipeline section")
		}
	}
	if _, err := parseConfig([]string{"--soak-term", "0.5s"}, io.Discard); err == nil || !strings.Contains(err.Error(), "--soak-term") {
		t.Errorf("--soak-term 0.5s: %v, want it refused by name", err)
	}
}

// The soak checks the broker's goroutines against their level after each
// pipeline run; each open scrape connection is one of them, so scrapes
// that overlap must share the connection rather than leave a second one.
func TestOverlappingScrapesShareOneConnection(t *testing.T) {
	var conns, requests atomic.Int32
	arrived, release := make(chan struct{}), make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			close(arrived)
			<-release // the first scrape is in progress while the second begins
		}
		io.WriteString(w, "go_goroutines 28\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s := &soak{web: scrapeClient()}
	defer s.web.CloseIdleConnections()
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := s.scrape(ctx, srv.URL)
		first <- err
	}()
	<-arrived
	var once sync.Once
	trace := &httptrace.ClientTrace{GetConn: func(string) { once.Do(func() { close(release) }) }}
	m, err := s.scrape(httptrace.WithClientTrace(ctx, trace), srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if got := m.value("go_goroutines"); got != 28 {
		t.Fatalf("go_goroutines = %v, want 28", got)
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("two overlapping scrapes opened %d connections to the broker, want 1", n)
	}
}

// TestUnusableEventsAreNotExpected: a workload with malformed event times
// marks every 10th event, and the check wants exactly the others, once.
func TestUnusableEventsAreNotExpected(t *testing.T) {
	wl := workload{events: 30, stamp: 1, unusableEvery: 10, keyPrefix: "k"}
	msgs := wl.plan()
	if n := wl.unusableIn(msgs); n != 3 || wl.good() != 27 {
		t.Fatalf("%d unusable messages and %d good events; want 3 and 27", n, wl.good())
	}
	seen := map[string]int{}
	for _, m := range msgs {
		a := wl.attrs(m)
		if wl.unusable(m.event) != (a[attrTime] == "not-a-time") || a[attrTime] == "" {
			t.Fatalf("event %d: ts %q", m.event, a[attrTime])
		}
		if !wl.unusable(m.event) {
			seen[a[attrKey]] = 1
		}
	}
	if _, err := verifyOutputs(wl, seen, 0, false); err != nil {
		t.Fatalf("the good events once: %v", err)
	}
	seen[wl.key(9)] = 1 // an unusable event emitted
	var ce *correctnessError
	if _, err := verifyOutputs(wl, seen, 0, true); !errors.As(err, &ce) {
		t.Fatalf("an unusable event in the output passed: %v", err)
	}
}

// A run told to write its plots into a new folder keeps its measurements:
// results.json is saved there before the plots make the folder.
func TestSaveMakesItsFolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new", "results.json")
	e := &env{stderr: io.Discard, rows: []row{{section: "pipeline", group: "30% copies", name: nameMem, unit: "msg/s in", values: []float64{5}}}}
	if err := e.save(path); err != nil {
		t.Fatal(err)
	}
	var back env
	if err := back.load(path); err != nil {
		t.Fatal(err)
	}
	if len(back.rows) != 1 || back.rows[0].values[0] != 5 {
		t.Fatalf("rows saved and loaded back: %+v", back.rows)
	}
}
