package gate

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/backoff"
)

// metrics is the outcome counters and the gate's histograms and gauges,
// collected together: one set of names for every front end, so dashboards
// and alerts work for each.
type metrics struct {
	counter

	latency prometheus.Histogram // publish → work done, per message
	// One observation per call, whatever the batch's size: a per-message
	// figure would weigh a batch's latency by its size.
	storeTime prometheus.Histogram
	workTime  prometheus.Histogram
	// Delays of caught copies since their key's first sight, and of the
	// copies the audit recognised after the horizon: what horizon advice
	// is made of.
	republishDelay  prometheus.Histogram
	redeliveryDelay prometheus.Histogram
	lateDelay       prometheus.Histogram // nil without an audit
	// held counts deliveries of messages neither worked nor moved aside.
	held      prometheus.Counter
	horizon   func() int // live keys, when the store can tell
	audit     func() audit.Stats
	watermark func() (time.Time, bool)
	deps      []dependency // what Ready is made of, for dedupflow_dependency_up
	horizonS  float64      // the horizon, and its mode, for advice
	mode      string
	started   time.Time
}

// dependency is one thing the gate needs to answer, as
// dedupflow_dependency_up{dependency} names it.
type dependency struct {
	name    string
	tracker *backoff.Tracker
}

// delayBuckets run from 10 ms to the horizon in steps of about 1.6×, so
// advice can place a quantile within that factor.
func delayBuckets(horizon time.Duration) []float64 {
	return prometheus.ExponentialBucketsRange(0.01, max(horizon.Seconds(), 0.02), 24)
}

func newMetrics(work string, horizon, auditHorizon time.Duration) *metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	m := &metrics{
		republishDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_republish_delay_seconds", Buckets: delayBuckets(horizon),
			Help: "Time from a key's first sight (with a sliding horizon: its latest caught copy) to each republished copy caught within the horizon."}),
		redeliveryDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_redelivery_delay_seconds", Buckets: delayBuckets(horizon),
			Help: "Time from a key's first sight to each redelivery caught within the horizon (a sign of late or lost acks, not of publishers)."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_end_to_end_latency_seconds", Help: "Time from publish to the message's " + work + " succeeding.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		storeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_store_batch_seconds", Buckets: buckets,
			Help: "Latency of one dedup store claim call, which claims a batch of messages' keys (one key where messages are received one at a time)."}),
		workTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_" + work + "_batch_seconds", Buckets: buckets,
			Help: "Duration of one " + work + " call, which takes a batch of messages (one where messages are received one at a time)."}),
		held: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupflow_held_deliveries_total",
			Help: "Deliveries of unusable messages that could not be dead-lettered (no dead-letter topic, or it refused them): nacked and held back, they come back until removed."}),
	}
	if auditHorizon > horizon {
		m.lateDelay = prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "dedupflow_late_republish_delay_seconds",
			Buckets: prometheus.ExponentialBucketsRange(horizon.Seconds(), auditHorizon.Seconds(), 12),
			Help:    "Approximate time from a key's first sight to each copy the audit filter recognised after the horizon (to one audit generation; may include false positives)."})
	}
	return m
}

// histograms are the metrics' histograms, for Describe and Collect.
func (m *metrics) histograms() []prometheus.Histogram {
	h := []prometheus.Histogram{m.latency, m.storeTime, m.workTime, m.republishDelay, m.redeliveryDelay}
	if m.lateDelay != nil {
		h = append(h, m.lateDelay)
	}
	return h
}

var (
	descHorizon  = prometheus.NewDesc("dedupflow_horizon_keys", "Keys held in the dedup horizon.", nil, nil)
	descHorizonS = prometheus.NewDesc("dedupflow_horizon_seconds", "The dedup horizon in force, labelled fixed or sliding.", []string{"mode"}, nil)
	descStarted  = prometheus.NewDesc("dedupflow_start_time_seconds", "When this process began deduping (Unix seconds): the basis of horizon advice.", nil, nil)
	descUp       = prometheus.NewDesc("dedupflow_dependency_up",
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
	m.counter.Describe(ch)
	m.held.Describe(ch)
	ch <- descHorizon
	ch <- descHorizonS
	ch <- descStarted
	ch <- descUp
	ch <- descWatermark
	ch <- descAuditBytes
	ch <- descAuditKeys
	ch <- descAuditCapacity
	ch <- descAuditFP
	for _, h := range m.histograms() {
		h.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.counter.Collect(ch)
	m.held.Collect(ch)
	if m.horizon != nil {
		ch <- prometheus.MustNewConstMetric(descHorizon, prometheus.GaugeValue, float64(m.horizon()))
	}
	ch <- prometheus.MustNewConstMetric(descHorizonS, prometheus.GaugeValue, m.horizonS, m.mode)
	ch <- prometheus.MustNewConstMetric(descStarted, prometheus.GaugeValue, float64(m.started.UnixNano())/1e9)
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
	for _, h := range m.histograms() {
		h.Collect(ch)
	}
}
