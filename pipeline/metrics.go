package pipeline

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/internal/outcome"
)

// Outcome is what became of one received message.
type Outcome = outcome.Outcome

// Outcomes, as counted in dedupflow_messages_total{outcome}.
const (
	Emitted             = outcome.Emitted
	DuplicateRedelivery = outcome.DuplicateRedelivery
	DuplicateRepublish  = outcome.DuplicateRepublish
	DeadLettered        = outcome.DeadLettered
	InFlightConflict    = outcome.InFlightConflict
	// Retried messages were nacked to come back later: the store or sink
	// failed, or the message was invalid and no dead-letter topic is set.
	Retried = outcome.Retried
)

// Counts is a snapshot of the pipeline's counters: the shared outcome
// counters (outcome.Counts, field for field) and the pipeline's own.
type Counts struct {
	Received            int64
	Emitted             int64
	DuplicateRedelivery int64
	DuplicateRepublish  int64
	DeadLettered        int64
	InFlightConflict    int64
	Retried             int64
	MissingID           int64
	// LateDuplicateSuspected counts emitted messages the audit marked as
	// probable late duplicates; they are also in Emitted.
	LateDuplicateSuspected int64
	// TooLate counts messages too late to judge in event time, passed or
	// dead-lettered by the late policy; they are also in Emitted or
	// DeadLettered.
	TooLate int64
}

// metrics holds the counters as atomics, the one source of truth both for
// Prometheus (through a collector that reads them) and for the console.
type metrics struct {
	outcome.Counter // received, outcomes, missing id
	// Not outcomes: each of these messages is also counted under the
	// outcome it had (emitted, dead_lettered), so the outcomes still add
	// up to received.
	lateSuspected atomic.Int64
	tooLate       atomic.Int64

	latency   prometheus.Histogram // publish → emitted
	storeTime prometheus.Histogram
	sinkTime  prometheus.Histogram
	horizon   func() int // live keys, when the store can tell
	audit     func() audit.Stats
	watermark func() (time.Time, bool)
	deps      []dependency // what Ready is made of, for dedupflow_dependency_up
}

// dependency is one thing the pipeline needs to answer, as
// dedupflow_dependency_up{dependency} names it.
type dependency struct {
	name    string
	tracker *backoff.Tracker
}

// watch exports the trackers Ready reads as dedupflow_dependency_up, so an
// alert can say which dependency took readiness away; the dead-letter topic
// only when there is one.
func (m *metrics) watch(store, sink, deadLetter *backoff.Tracker, hasDeadLetter bool) {
	m.deps = []dependency{{"store", store}, {"sink", sink}}
	if hasDeadLetter {
		m.deps = append(m.deps, dependency{"dead_letter", deadLetter})
	}
}

func newMetrics() *metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_end_to_end_latency_seconds", Help: "Time from publish to emitted output.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		storeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_store_seconds", Help: "Latency of dedup store claims.", Buckets: buckets}),
		sinkTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_sink_seconds", Help: "Latency of sink writes.", Buckets: buckets}),
	}
}

func (m *metrics) snapshot() Counts {
	c := m.Snapshot()
	return Counts{
		Received:            c.Received,
		Emitted:             c.Emitted,
		DuplicateRedelivery: c.DuplicateRedelivery,
		DuplicateRepublish:  c.DuplicateRepublish,
		DeadLettered:        c.DeadLettered,
		InFlightConflict:    c.InFlightConflict,
		Retried:             c.Retried,
		MissingID:           c.MissingID,

		LateDuplicateSuspected: m.lateSuspected.Load(),
		TooLate:                m.tooLate.Load(),
	}
}

func since(t time.Time, now time.Time) float64 { return now.Sub(t).Seconds() }

var (
	descHorizon = prometheus.NewDesc("dedupflow_horizon_keys", "Keys held in the dedup horizon.", nil, nil)
	descUp      = prometheus.NewDesc("dedupflow_dependency_up",
		"1 while the dependency answers; 0 from a failure until it answers again (/readyz is ready while all are 1).", []string{"dependency"}, nil)

	descLateSuspected = prometheus.NewDesc("dedupflow_late_duplicates_suspected_total",
		"Emitted messages whose key the audit filter saw beyond the dedup horizon (marked dedupflow_late_duplicate=probable; also counted as emitted).", nil, nil)
	descTooLate = prometheus.NewDesc("dedupflow_too_late_total",
		"Messages too late to judge in event time, passed or dead-lettered by --late (also counted under their outcome).", nil, nil)
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
	ch <- descLateSuspected
	ch <- descTooLate
	ch <- descWatermark
	ch <- descAuditBytes
	ch <- descAuditKeys
	ch <- descAuditCapacity
	ch <- descAuditFP
	m.latency.Describe(ch)
	m.storeTime.Describe(ch)
	m.sinkTime.Describe(ch)
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
	ch <- prometheus.MustNewConstMetric(descLateSuspected, prometheus.CounterValue, float64(m.lateSuspected.Load()))
	ch <- prometheus.MustNewConstMetric(descTooLate, prometheus.CounterValue, float64(m.tooLate.Load()))
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
	m.sinkTime.Collect(ch)
}
