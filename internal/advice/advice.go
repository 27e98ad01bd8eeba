// Package advice tells a user how long their horizon has to be, from what
// a running front end measured: the delays of the republished copies it
// caught within the horizon (dedupflow_republish_delay_seconds) and, with
// an audit horizon, of those the audit filter recognised after it
// (dedupflow_late_republish_delay_seconds, approximate). It reads metric
// families, so the /advice endpoint, the console and `dedupflow advise`
// (which scrapes /metrics) give the same answer.
package advice

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
)

// MinCopies is how many republished copies advice needs before it gives a
// horizon: below it, a quantile is a guess.
const MinCopies = 100

// Metric names read.
const (
	caughtName  = "dedupflow_republish_delay_seconds"
	lateName    = "dedupflow_late_republish_delay_seconds"
	horizonName = "dedupflow_horizon_seconds"
	startName   = "dedupflow_start_time_seconds"
)

// Advice is the answer, with its basis.
type Advice struct {
	Horizon time.Duration `json:"-"`
	Mode    string        `json:"mode"` // fixed or sliding
	// Caught is the republished copies caught within the horizon; Late
	// those the audit filter recognised after it (0 without an audit).
	Caught uint64 `json:"caught"`
	Late   uint64 `json:"late"`
	// Audited says whether copies after the horizon can be seen at all.
	Audited bool `json:"audited"`
	// Over is how long the process has been measuring.
	Over time.Duration `json:"-"`
	// CaughtShare is Caught over Caught+Late.
	CaughtShare float64 `json:"caught_share"`
	// Needs is the horizon that would have caught 99% and 99.9% of the
	// copies seen, to a histogram bucket (rounded up); zero when not
	// enough copies were seen, or when the share lies past what the audit
	// remembers.
	Needs99  time.Duration `json:"-"`
	Needs999 time.Duration `json:"-"`
	Enough   bool          `json:"enough_data"`
	Text     string        `json:"text"`
}

// MarshalJSON writes the durations as seconds, as the metrics give them.
func (a Advice) MarshalJSON() ([]byte, error) {
	type plain Advice // without this method
	return json.Marshal(struct {
		plain
		Horizon  float64 `json:"horizon_seconds"`
		Over     float64 `json:"over_seconds"`
		Needs99  float64 `json:"needs_99_seconds"`
		Needs999 float64 `json:"needs_999_seconds"`
	}{plain(a), a.Horizon.Seconds(), a.Over.Seconds(), a.Needs99.Seconds(), a.Needs999.Seconds()})
}

// From computes the advice from gathered or scraped metric families at
// now.
func From(mfs []*dto.MetricFamily, now time.Time) Advice {
	var a Advice
	var caught, late *dto.Histogram
	for _, mf := range mfs {
		ms := mf.GetMetric()
		if len(ms) == 0 {
			continue
		}
		switch mf.GetName() {
		case caughtName:
			caught = ms[0].GetHistogram()
		case lateName:
			late = ms[0].GetHistogram()
		case horizonName:
			a.Horizon = seconds(ms[0].GetGauge().GetValue())
			for _, l := range ms[0].GetLabel() {
				if l.GetName() == "mode" {
					a.Mode = l.GetValue()
				}
			}
		case startName:
			a.Over = now.Sub(time.Unix(0, int64(ms[0].GetGauge().GetValue()*1e9)))
		}
	}
	if caught == nil || a.Horizon == 0 {
		a.Text = "no horizon advice: these metrics are not a dedupflow pipeline's or consumer's"
		return a
	}
	a.Caught = caught.GetSampleCount()
	a.Audited = late != nil
	if late != nil {
		a.Late = late.GetSampleCount()
	}
	seen := a.Caught + a.Late
	if seen > 0 {
		a.CaughtShare = float64(a.Caught) / float64(seen)
	}
	a.Enough = seen >= MinCopies
	if a.Enough {
		a.Needs99 = quantile(caught, late, 0.99, seen)
		a.Needs999 = quantile(caught, late, 0.999, seen)
	}
	a.Text = a.text()
	return a
}

// quantile is the smallest bucket bound under which share q of the seen
// copies fall, over both histograms; zero if that lies past the last
// bucket the audit has.
func quantile(caught, late *dto.Histogram, q float64, seen uint64) time.Duration {
	want := uint64(math.Ceil(q * float64(seen)))
	for _, h := range []*dto.Histogram{caught, late} {
		var base uint64
		if h == late {
			if late == nil {
				return 0
			}
			base = caught.GetSampleCount()
		}
		for _, b := range h.GetBucket() {
			if base+b.GetCumulativeCount() >= want {
				return seconds(b.GetUpperBound())
			}
		}
	}
	return 0
}

func (a Advice) text() string {
	h := Short(a.Horizon) + " horizon"
	if a.Mode == "sliding" {
		h = Short(a.Horizon) + " sliding horizon (each caught copy extends its key; delays are from the latest caught copy)"
	}
	basis := fmt.Sprintf("%d republished copies over %s", a.Caught+a.Late, Short(a.Over.Round(time.Second)))
	if !a.Enough {
		return fmt.Sprintf("not enough data for horizon advice: %s, advice needs at least %d", basis, MinCopies)
	}
	var b strings.Builder
	if a.Audited {
		fmt.Fprintf(&b, "your %s caught %.1f%% of the republishes seen (%s)", h, 100*a.CaughtShare, basis)
	} else {
		fmt.Fprintf(&b, "your %s caught %s; copies after it are not seen without --audit-horizon", h, basis)
	}
	switch {
	case a.Needs999 == 0:
		b.WriteString("; 99.9% lies past what the audit horizon remembers")
	case a.Needs999 <= a.Horizon:
		fmt.Fprintf(&b, "; 99%% came within %s and 99.9%% within %s", Short(a.Needs99), Short(a.Needs999))
	default:
		fmt.Fprintf(&b, "; 99.9%% needs about %s", Short(a.Needs999))
	}
	return b.String()
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Short writes a duration the way people say it: 14m, 2.1s, 3h12m.
func Short(d time.Duration) string {
	switch {
	case d >= time.Hour:
		d = d.Round(time.Minute)
		return pair(int64(d/time.Hour), "h", int64(d%time.Hour/time.Minute), "m")
	case d >= time.Minute:
		d = d.Round(time.Second)
		return pair(int64(d/time.Minute), "m", int64(d%time.Minute/time.Second), "s")
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// pair writes "3h12m", or "3h" when the smaller unit is zero.
func pair(big int64, bigUnit string, small int64, smallUnit string) string {
	if small == 0 {
		return fmt.Sprintf("%d%s", big, bigUnit)
	}
	return fmt.Sprintf("%d%s%d%s", big, bigUnit, small, smallUnit)
}
