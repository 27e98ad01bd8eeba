package gate

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dedupflow/dedupflow/outcome"
)

func TestCounter(t *testing.T) {
	var c counter // the zero value is ready
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c.Received(1)
			c.Count(outcome.Emitted, 1)
			c.Missing("a")
		})
	}
	wg.Wait()
	c.Received(1)
	c.Count(outcome.Retried, 1)
	c.Count("no such outcome", 1)
	c.Missing("")

	want := outcome.Counts{Received: 9, Emitted: 8, Retried: 1, MissingID: 9}
	if got := c.Snapshot(); got != want {
		t.Errorf("Snapshot() = %+v, want %+v", got, want)
	}

	mfs := gather(t, &c)
	type sample struct {
		name, label string
		value       float64
	}
	help := map[string]string{}
	var got []sample
	for _, mf := range mfs {
		help[mf.GetName()] = mf.GetHelp()
		for _, m := range mf.GetMetric() {
			s := sample{name: mf.GetName(), value: m.GetCounter().GetValue()}
			for _, l := range m.GetLabel() {
				s.label = l.GetName() + "=" + l.GetValue()
			}
			got = append(got, s)
		}
	}
	wantHelp := map[string]string{
		"dedupflow_received_total":   "Messages received from the input.",
		"dedupflow_messages_total":   "Received messages by outcome.",
		"dedupflow_missing_id_total": "Messages without the id attribute, by the producer attribute's value.",
	}
	for n, h := range wantHelp {
		if help[n] != h {
			t.Errorf("help of %s = %q, want %q", n, help[n], h)
		}
	}
	wantSamples := []sample{ // Gather sorts by name, then label
		{"dedupflow_late_duplicates_suspected_total", "", 0},
		{"dedupflow_messages_total", "outcome=dead_lettered", 0},
		{"dedupflow_messages_total", "outcome=duplicate_redelivery", 0},
		{"dedupflow_messages_total", "outcome=duplicate_republish", 0},
		{"dedupflow_messages_total", "outcome=emitted", 8},
		{"dedupflow_messages_total", "outcome=in_flight_conflict", 0},
		{"dedupflow_messages_total", "outcome=retried", 1},
		{"dedupflow_missing_id_total", "producer=", 1},
		{"dedupflow_missing_id_total", "producer=a", 8},
		{"dedupflow_received_total", "", 9},
		{"dedupflow_too_late_total", "", 0},
	}
	if len(got) != len(wantSamples) {
		t.Fatalf("gathered %v, want %v", got, wantSamples)
	}
	for i := range got {
		if got[i] != wantSamples[i] {
			t.Errorf("sample %d = %+v, want %+v", i, got[i], wantSamples[i])
		}
	}
}

func TestProducerLabelsCapped(t *testing.T) {
	var c counter
	for i := 0; i < maxProducers+50; i++ {
		c.Missing(fmt.Sprint("producer-", i))
	}
	c.Missing("producer-0") // a known value keeps its own label
	reg := prometheus.NewRegistry()
	reg.MustRegister(&c)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "dedupflow_missing_id_total" {
			continue
		}
		if n := len(mf.GetMetric()); n != maxProducers+1 {
			t.Fatalf("%d producer series, want %d plus %q", n, maxProducers, otherProducers)
		}
		for _, m := range mf.GetMetric() {
			if lv := m.GetLabel()[0].GetValue(); lv == otherProducers && m.GetCounter().GetValue() != 50 {
				t.Fatalf("%q counted %v, want the 50 past the cap", otherProducers, m.GetCounter().GetValue())
			}
		}
		return
	}
	t.Fatal("no dedupflow_missing_id_total")
}

// CountFrom counts the outcome as Count does, and under the producer for
// dedupflow_producer_messages_total, with every outcome exported for each
// producer seen; producers only counted as missing get no such series, and
// a producer counted both ways shares one label value.
func TestCountFrom(t *testing.T) {
	var c counter
	c.CountFrom(outcome.Emitted, "billing")
	c.CountFrom(outcome.DuplicateRepublish, "billing")
	c.CountFrom(outcome.DuplicateRepublish, "billing")
	c.CountFrom(outcome.Emitted, "")
	c.CountFrom("no such outcome", "checkout")
	c.Missing("billing")
	c.Missing("legacy")
	if got, want := c.Snapshot(), (outcome.Counts{Emitted: 2, DuplicateRepublish: 2, MissingID: 2}); got != want {
		t.Errorf("Snapshot() = %+v, want %+v", got, want)
	}
	mfs := gather(t, &c)
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += " " + l.GetName() + "=" + l.GetValue()
			}
			got[key] = m.GetCounter().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"dedupflow_producer_messages_total outcome=emitted producer=billing":             1,
		"dedupflow_producer_messages_total outcome=duplicate_republish producer=billing": 2,
		"dedupflow_producer_messages_total outcome=retried producer=billing":             0,
		"dedupflow_producer_messages_total outcome=emitted producer=":                    1,
		"dedupflow_missing_id_total producer=billing":                                    1,
		"dedupflow_missing_id_total producer=legacy":                                     1,
	} {
		if v, ok := got[key]; !ok || v != want {
			t.Errorf("%s = %v (exported: %v), want %v", key, v, ok, want)
		}
	}
	for key := range got {
		if strings.Contains(key, "producer=checkout") || strings.Contains(key, "producer_messages_total outcome=emitted producer=legacy") {
			t.Errorf("unexpected series %s", key)
		}
	}
	n := 0
	for key := range got {
		if strings.HasPrefix(key, "dedupflow_producer_messages_total ") || strings.HasPrefix(key, "dedupflow_missing_id_total ") {
			n++
		}
	}
	if n != 2*6+2 { // billing and "" × 6 outcomes; 2 missing
		t.Errorf("%d producer series, want 14: %v", n, got)
	}
}

// gather is what a pedantic registry collects from c.
func gather(t *testing.T, c *counter) []*dto.MetricFamily {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}
