package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"go.yaml.in/yaml/v3"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// query is one PromQL expression users are given, and where it is.
type query struct{ where, expr string }

// alertQueries are the expressions of deploy/prometheus/alerts.yaml.
func alertQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Rules []struct{ Alert, Expr string }
		}
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatalf("alerts.yaml: %v", err)
	}
	var qs []query
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{"alert " + r.Alert, r.Expr})
		}
	}
	if len(qs) == 0 {
		t.Fatal("alerts.yaml has no rules")
	}
	return qs
}

// dashboard is the part of the Grafana dashboard model the tests read.
type dashboard struct {
	Panels []struct {
		ID      int
		Type    string
		Title   string
		GridPos struct{ H, W, X, Y int } `json:"gridPos"`
		Targets []struct {
			Expr  string
			RefID string `json:"refId"`
		}
	}
	Templating struct {
		List []struct {
			Name       string
			Definition string
		}
	}
}

// dashboardQueries are the expressions of deploy/grafana/dedupflow.json's
// panels and variables.
func dashboardQueries(t *testing.T) []query {
	t.Helper()
	b, err := os.ReadFile("grafana/dedupflow.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dedupflow.json: %v", err)
	}
	var qs []query
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.X+p.GridPos.W > 24 || p.GridPos.W == 0 {
			t.Errorf("panel %q: gridPos %+v outside Grafana's 24 columns", p.Title, p.GridPos)
		}
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("panel %q %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	for _, v := range d.Templating.List {
		if v.Definition != "" {
			qs = append(qs, query{"variable " + v.Name, v.Definition})
		}
	}
	return qs
}

var (
	metricRef  = regexp.MustCompile(`\b(dedupflow_\w+)(\{[^}]*\})?`)
	matcherRef = regexp.MustCompile(`(\w+)\s*(=~|!=|!~|=)\s*"([^"]*)"`)
	// Labels Prometheus adds to a target's series; the pipeline does not.
	targetLabels = []string{"job", "instance", "namespace", "pod"}
)

// checkQuery reports every metric a query names that the scrape lacks, and
// every label=value it selects that no exported series has.
func checkQuery(t *testing.T, q query, mfs map[string]*dto.MetricFamily) {
	t.Helper()
	refs := metricRef.FindAllStringSubmatch(q.expr, -1)
	if len(refs) == 0 {
		t.Errorf("%s names no dedupflow metric: %s", q.where, q.expr)
	}
	for _, ref := range refs {
		name := ref[1]
		mf := mfs[name]
		if mf == nil {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, ok := strings.CutSuffix(name, suffix); ok && mfs[base].GetType() == dto.MetricType_HISTOGRAM {
					mf = mfs[base]
				}
			}
		}
		if mf == nil {
			t.Errorf("%s: %s is not exported by the pipeline", q.where, name)
			continue
		}
		for _, m := range matcherRef.FindAllStringSubmatch(ref[2], -1) {
			label, op, val := m[1], m[2], m[3]
			if slices.Contains(targetLabels, label) {
				continue
			}
			if !familyHasLabel(mf, label, "") {
				t.Errorf("%s: %s has no label %q", q.where, name, label)
			} else if op == "=" && !strings.Contains(val, "$") && !familyHasLabel(mf, label, val) {
				t.Errorf("%s: no %s series has %s=%q", q.where, name, label, val)
			}
		}
	}
}

// familyHasLabel reports whether a series of mf has the label (with value
// val, unless val is empty).
func familyHasLabel(mf *dto.MetricFamily, label, val string) bool {
	for _, m := range mf.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && (val == "" || l.GetValue() == val) {
				return true
			}
		}
	}
	return false
}

// The alert rules load and pass their unit tests in promtool: every rule
// fires on the series it is meant for and stays quiet on the others.
func TestAlertRules(t *testing.T) {
	promtool := testenv.Tool(t, "promtool")
	for _, args := range [][]string{
		{"check", "rules", "prometheus/alerts.yaml"},
		{"test", "rules", "prometheus/alerts_test.yaml"},
	} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// Every dashboard query is valid PromQL: promtool checks them as recording
// rules, with Grafana's variables given values.
func TestDashboardQueriesParse(t *testing.T) {
	promtool := testenv.Tool(t, "promtool")
	grafanaVars := strings.NewReplacer("$__rate_interval", "5m", "$job", ".*")
	type rule struct{ Record, Expr string }
	var rules []rule
	for i, q := range dashboardQueries(t) {
		if strings.HasPrefix(q.expr, "label_values(") {
			continue // Grafana's own function, not PromQL
		}
		rules = append(rules, rule{fmt.Sprintf("dashboard_query_%d", i), grafanaVars.Replace(q.expr)})
	}
	b, err := yaml.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": rules}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("promtool check rules (the dashboard's queries): %v\n%s", err, out)
	}
}

// A pipeline run from the container image (or built from this tree without
// one) against the broker: it dedups, dead-letters, reports ready, logs JSON
// lines that log pipelines parse, stops cleanly on SIGTERM, and exports every
// metric and label value the dashboard and the alert rules query.
func TestPipelineServesWhatDashboardAndAlertsQuery(t *testing.T) {
	tp := newTopology(t)
	// A zone that is not the host's: log times in +05:30 show that the
	// binary read the image's own zoneinfo.
	p := startPipeline(t, dedupflow(t), tp, []string{"TZ=Asia/Kolkata"},
		"--id-attribute", "event_id", "--producer-attribute", "source", "--timestamp-attribute", "occurred_at",
		"--audit-horizon", "1h")
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, p.metrics+path); code != 200 {
			fatalf(t, p, "%s: %d %s", path, code, body)
		}
	}

	first := publish(t, tp.c, tp.in, "order 1", map[string]string{"event_id": "order-1", "source": "billing", "occurred_at": nowMillis()})
	publish(t, tp.c, tp.in, "order 1, retried", map[string]string{"event_id": "order-1", "source": "billing", "occurred_at": nowMillis()})
	publish(t, tp.c, tp.in, "no key", map[string]string{"source": "checkout", "occurred_at": nowMillis()})
	bad := publish(t, tp.c, tp.in, "bad time", map[string]string{"event_id": "order-2", "source": "billing", "occurred_at": "yesterday"})

	// The outcomes, and the per-producer series counted beside them: a
	// scrape may fall between the two.
	want := map[string]float64{"emitted": 2, "duplicate_republish": 1, "dead_lettered": 1}
	var mfs map[string]*dto.MetricFamily
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		mfs = p.scrape(t)
		done := value(mfs, "dedupflow_missing_id_total", map[string]string{"producer": "checkout"}) == 1 &&
			value(mfs, "dedupflow_producer_messages_total", map[string]string{"producer": "billing", "outcome": "duplicate_republish"}) == 1
		for o, n := range want {
			done = done && value(mfs, "dedupflow_messages_total", map[string]string{"outcome": o}) == n
		}
		if done {
			break
		}
		if time.Now().After(deadline) {
			fatalf(t, p, `outcomes never reached %v, with dedupflow_missing_id_total{producer="checkout"} 1 and `+
				`dedupflow_producer_messages_total{producer="billing",outcome="duplicate_republish"} 1`, want)
		}
	}
	outs := receive(t, tp.c, tp.outSub, 2)
	datas := []string{string(outs[0].Data), string(outs[1].Data)}
	slices.Sort(datas)
	if !slices.Equal(datas, []string{"no key", "order 1"}) {
		t.Errorf("outputs %q, want order 1 and no key once each", datas)
	}
	if dl := receive(t, tp.c, tp.deadSub, 1)[0]; dl.Attributes["dedupflow_source_message_id"] != bad {
		t.Errorf("dead letter %q from %q, want the message with the bad timestamp (%s)", dl.Data, dl.Attributes["dedupflow_source_message_id"], bad)
	}

	for _, q := range append(dashboardQueries(t), alertQueries(t)...) {
		checkQuery(t, q, mfs)
	}

	if err := p.stop(t); err != nil {
		t.Errorf("pipeline after SIGTERM: %v, want exit 0", err)
	}
	checkJSONLogs(t, p.log, bad, first)
}

// checkJSONLogs: every line is a JSON object with the fields log pipelines
// parse (time in RFC 3339, level, msg), and the dead-lettered message's line
// carries its message ID and the subscription as fields.
func checkJSONLogs(t *testing.T, lines []string, deadLettered, _ string) {
	t.Helper()
	found := false
	for _, line := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("log line is not JSON: %q", line)
			continue
		}
		ts, _ := rec["time"].(string)
		if _, err := time.Parse(time.RFC3339Nano, ts); err != nil || !strings.HasSuffix(ts, "+05:30") {
			t.Errorf("log line's time %q: want RFC 3339 in the zone of TZ=Asia/Kolkata (+05:30)", ts)
		}
		if _, ok := rec["level"].(string); !ok {
			t.Errorf("log line without level: %q", line)
		}
		if _, ok := rec["msg"].(string); !ok {
			t.Errorf("log line without msg: %q", line)
		}
		if rec["message_id"] == deadLettered {
			found = true
			if rec["subscription"] == nil {
				t.Errorf("the dead-lettered message's line does not name the subscription: %q", line)
			}
		}
	}
	if !found {
		t.Errorf("no log line names the dead-lettered message %s in message_id:\n%s", deadLettered, strings.Join(lines, "\n"))
	}
}
