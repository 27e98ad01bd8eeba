package advice

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// gathered is what a front end with a 10m horizon exports after the given
// observations (seconds) of caught and, with audit, late copies.
func gathered(t *testing.T, caught, late []float64, audit bool) Advice {
	t.Helper()
	reg := prometheus.NewRegistry()
	c := prometheus.NewHistogram(prometheus.HistogramOpts{Name: caughtName, Help: "h",
		Buckets: prometheus.ExponentialBucketsRange(0.01, 600, 24)})
	reg.MustRegister(c)
	for _, v := range caught {
		c.Observe(v)
	}
	if audit {
		l := prometheus.NewHistogram(prometheus.HistogramOpts{Name: lateName, Help: "h",
			Buckets: prometheus.ExponentialBucketsRange(600, 7*24*3600, 12)})
		reg.MustRegister(l)
		for _, v := range late {
			l.Observe(v)
		}
	}
	h := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: horizonName, Help: "h"}, []string{"mode"})
	h.WithLabelValues("fixed").Set(600)
	start := prometheus.NewGauge(prometheus.GaugeOpts{Name: startName, Help: "h"})
	now := time.Unix(1_700_000_000, 0)
	start.Set(float64(now.Add(-3 * time.Hour).Unix()))
	reg.MustRegister(h, start)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	return From(mfs, now)
}

func repeat(v float64, n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

func TestAdvice(t *testing.T) {
	t.Run("not enough data", func(t *testing.T) {
		a := gathered(t, repeat(1, 50), nil, false)
		if a.Enough || !strings.Contains(a.Text, "not enough data") || !strings.Contains(a.Text, "50 republished copies over 3h") {
			t.Fatalf("%+v", a)
		}
	})
	t.Run("everything within the horizon", func(t *testing.T) {
		a := gathered(t, append(repeat(1, 990), repeat(20, 10)...), nil, false)
		// 99% at 1 s and 99.9% at 20 s, each rounded up to its bucket
		// (buckets step by about 1.6×).
		if !a.Enough || a.Needs99 < time.Second || a.Needs99 > 1700*time.Millisecond ||
			a.Needs999 < 20*time.Second || a.Needs999 > 33*time.Second {
			t.Fatalf("%+v", a)
		}
		if !strings.Contains(a.Text, "copies after it are not seen without --audit-horizon") || !strings.Contains(a.Text, "99.9% within") {
			t.Errorf("text %q", a.Text)
		}
	})
	t.Run("the audit saw copies after the horizon", func(t *testing.T) {
		a := gathered(t, repeat(1, 996), repeat(840, 4), true)
		if a.Caught != 996 || a.Late != 4 || a.CaughtShare != 0.996 {
			t.Fatalf("%+v", a)
		}
		// 99.9% needs the late copies at 14 minutes: a bucket at or above it.
		if a.Needs999 < 14*time.Minute || a.Needs999 > 30*time.Minute {
			t.Fatalf("needs %v for 99.9%%, want about 14m", a.Needs999)
		}
		if !strings.HasPrefix(a.Text, "your 10m horizon caught 99.6% of the republishes seen (1000 republished copies over 3h)") ||
			!strings.Contains(a.Text, "99.9% needs about") {
			t.Errorf("text %q", a.Text)
		}
	})
	t.Run("not a dedupflow process", func(t *testing.T) {
		if a := From(nil, time.Now()); a.Enough || !strings.Contains(a.Text, "not a dedupflow") {
			t.Fatalf("%+v", a)
		}
	})
}

func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{
		3 * time.Hour: "3h", 3*time.Hour + 12*time.Minute: "3h12m", 14 * time.Minute: "14m",
		18*time.Minute + 45*time.Second: "18m45s", 2100 * time.Millisecond: "2.1s", 12 * time.Millisecond: "12ms",
	} {
		if got := Short(d); got != want {
			t.Errorf("Short(%v) = %q, want %q", d, got, want)
		}
	}
}
