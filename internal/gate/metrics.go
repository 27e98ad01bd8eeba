package gate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/internal/outcome"
)

// metrics is the outcome counters and the gate's histograms and gauges,
// collected together: one set of names for every front end, so dashboards
// and alerts work for each.
type metrics struct {
	outcome.Counter

	latency   prometheus.Histogram // publish → work done
	storeTime prometheus.Histogram
	workTime  prometheus.Histogram
	horizon   func() int // live keys, when the store can tell
	audit     func() audit.Stats
	watermark func() (time.Time, bool)
	deps      []dependency // what Ready is made of, for dedupflow_dependency_up
}

// dependency is one thing the gate needs to answer, as
// dedupflow_dependency_up{dependency} names it.
type dependency struct {
	name    string
	tracker *backoff.Tracker
}

func newMetrics(work string) *metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_end_to_end_latency_seconds", Help: "Time from publish to the message's " + work + " succeeding.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		storeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_store_seconds", Help: "Latency of dedup store claims.", Buckets: buckets}),
		workTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_" + work + "_seconds", Help: "Duration of " + work + " calls.", Buckets: buckets}),
	}
}

var (
	descHorizon   = prometheus.NewDesc("dedupflow_horizon_keys", "Keys held in the dedup horizon.", nil, nil)
	descUp        = prometheus.NewDesc("dedupflow_dependency_up",
		"1 while the dependency answers; 0 from a failure until it answers again (/readyz is ready while all are 1).", []string{"dependency"}, nil)
	descWatermark = prometheus.NewDesc("dedupflow_watermark_timestamp_seconds",
		"Event-time watermark of this process (highest event time seen minus the allowed lateness).", nil, nil)
	descAuditBytes    = prometheus.NewDesc("dedupflow_audit_filter_bytes", "Memory of the audit filter's bits, fixed at start.", nil, nil)
	descAuditKeys     = prometheus.NewDesc("dedupflow_audit_keys", "Keys added to the audit filter's live generations (a key seen in two generations counts twice).", nil, nil)
	descAuditCapacity = prometheus.NewDesc("dedupflow_audit_capacity_keys", "Keys per audit horizon the audit filter is sized for.", nil, nil)
	descAuditFP       = prometheus.NewDesc("dedupflow_audit_false_positive_ratio",
		"Estimated rate at which the audit filter wrongly reports a key as seen, from its fill.", nil, nil)
)

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.Counter.Describe(ch)
	ch <- descHorizon
	ch <- descUp
	ch <- descWatermark
	ch <- descAuditBytes
	ch <- descAuditKeys
	ch <- descAuditCapacity
	ch <- descAuditFP
	m.latency.Describe(ch)
	m.storeTime.Describe(ch)
	m.workTime.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.Counter.Collect(ch)
	if m.horizon != nil {
		ch <- prometheus.MustNewConstMetric(descHorizon, prometheus.GaugeValue, float64(m.horizon()))
	}
	for _, d := range m.deps {
		up := 0.0
		if d.tracker.Ready() {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, d.name)
	}
	if m.watermark != nil {
		if wm, ok := m.watermark(); ok {
			ch <- prometheus.MustNewConstMetric(descWatermark, prometheus.GaugeValue, float64(wm.UnixMilli())/1e3)
		}
	}
	if m.audit != nil {
		st := m.audit()
		ch <- prometheus.MustNewConstMetric(descAuditBytes, prometheus.GaugeValue, float64(st.Bytes))
		ch <- prometheus.MustNewConstMetric(descAuditKeys, prometheus.GaugeValue, float64(st.Keys))
		ch <- prometheus.MustNewConstMetric(descAuditCapacity, prometheus.GaugeValue, float64(st.Capacity))
		ch <- prometheus.MustNewConstMetric(descAuditFP, prometheus.GaugeValue, st.FalsePositive)
	}
	m.latency.Collect(ch)
	m.storeTime.Collect(ch)
	m.workTime.Collect(ch)
}
