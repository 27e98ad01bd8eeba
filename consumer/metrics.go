package consumer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/internal/outcome"
)

// Outcome is what became of one received message. The values are the
// pipeline's, so dashboards and alerts work for both.
type Outcome = outcome.Outcome

// Outcomes, as counted in dedupflow_messages_total{outcome}.
const (
	// Emitted: the handler returned nil; the key is committed, the message
	// acked.
	Emitted             = outcome.Emitted
	DuplicateRedelivery = outcome.DuplicateRedelivery
	DuplicateRepublish  = outcome.DuplicateRepublish
	// DeadLettered: no usable key, and OnReject took the message.
	DeadLettered     = outcome.DeadLettered
	InFlightConflict = outcome.InFlightConflict
	// Retried: nacked to come back later — the handler failed or panicked,
	// the store was unreachable, or the message had no usable key and
	// OnReject was unset or failed.
	Retried = outcome.Retried
)

// Counts is a snapshot of a Dedup's counters. The outcomes add up to
// Received once every message in flight is settled.
type Counts = outcome.Counts

// metrics is the shared outcome counters (the pipeline's names and labels)
// plus the consumer's histograms, collected together.
type metrics struct {
	outcome.Counter

	latency     prometheus.Histogram // publish → handled
	storeTime   prometheus.Histogram
	handlerTime prometheus.Histogram
}

func newMetrics() *metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	return &metrics{
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_end_to_end_latency_seconds", Help: "Time from publish to a successful handler call.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		storeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_store_seconds", Help: "Latency of dedup store claims.", Buckets: buckets}),
		handlerTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_handler_seconds", Help: "Duration of handler calls.", Buckets: buckets}),
	}
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.Counter.Describe(ch)
	m.latency.Describe(ch)
	m.storeTime.Describe(ch)
	m.handlerTime.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.Counter.Collect(ch)
	m.latency.Collect(ch)
	m.storeTime.Collect(ch)
	m.handlerTime.Collect(ch)
}
