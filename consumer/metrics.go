package consumer

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is what became of one received message. The values are the
// pipeline's, so dashboards and alerts work for both.
type Outcome string

// Outcomes, as counted in dedupflow_messages_total{outcome}.
const (
	// Emitted: the handler returned nil; the key is committed, the message
	// acked.
	Emitted             Outcome = "emitted"
	DuplicateRedelivery Outcome = "duplicate_redelivery"
	DuplicateRepublish  Outcome = "duplicate_republish"
	// DeadLettered: no usable key, and OnReject took the message.
	DeadLettered     Outcome = "dead_lettered"
	InFlightConflict Outcome = "in_flight_conflict"
	// Retried: nacked to come back later — the handler failed or panicked,
	// the store was unreachable, or the message had no usable key and
	// OnReject was unset or failed.
	Retried Outcome = "retried"
)

var outcomes = [...]Outcome{Emitted, DuplicateRedelivery, DuplicateRepublish, DeadLettered, InFlightConflict, Retried}

func (o Outcome) acked() bool { return o != Retried && o != InFlightConflict }

// Counts is a snapshot of a Dedup's counters. The outcomes add up to
// Received once every message in flight is settled.
type Counts struct {
	Received            int64
	Emitted             int64
	DuplicateRedelivery int64
	DuplicateRepublish  int64
	DeadLettered        int64
	InFlightConflict    int64
	Retried             int64
	MissingID           int64
}

// metrics keeps the counters as atomics, read both by Counts and by a
// Prometheus collector, so the two never disagree.
type metrics struct {
	received  atomic.Int64
	outcome   [len(outcomes)]atomic.Int64
	missingID atomic.Int64

	producersMu sync.Mutex
	producers   map[string]*atomic.Int64

	latency     prometheus.Histogram // publish → handled
	storeTime   prometheus.Histogram
	handlerTime prometheus.Histogram
}

func newMetrics() *metrics {
	buckets := prometheus.ExponentialBuckets(0.0005, 2, 16)
	return &metrics{
		producers: make(map[string]*atomic.Int64),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_end_to_end_latency_seconds", Help: "Time from publish to a successful handler call.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 18)}),
		storeTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_store_seconds", Help: "Latency of dedup store claims.", Buckets: buckets}),
		handlerTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "dedupflow_handler_seconds", Help: "Duration of handler calls.", Buckets: buckets}),
	}
}

func (m *metrics) count(o Outcome) {
	for i, x := range outcomes {
		if x == o {
			m.outcome[i].Add(1)
			return
		}
	}
}

func (m *metrics) missing(producer string) {
	m.missingID.Add(1)
	m.producersMu.Lock()
	c, ok := m.producers[producer]
	if !ok {
		c = new(atomic.Int64)
		m.producers[producer] = c
	}
	m.producersMu.Unlock()
	c.Add(1)
}

func (m *metrics) get(o Outcome) int64 {
	for i, x := range outcomes {
		if x == o {
			return m.outcome[i].Load()
		}
	}
	return 0
}

func (m *metrics) snapshot() Counts {
	return Counts{
		Received:            m.received.Load(),
		Emitted:             m.get(Emitted),
		DuplicateRedelivery: m.get(DuplicateRedelivery),
		DuplicateRepublish:  m.get(DuplicateRepublish),
		DeadLettered:        m.get(DeadLettered),
		InFlightConflict:    m.get(InFlightConflict),
		Retried:             m.get(Retried),
		MissingID:           m.missingID.Load(),
	}
}

// The names and labels are the pipeline's (pipeline/metrics.go).
var (
	descReceived = prometheus.NewDesc("dedupflow_received_total", "Messages received from the input.", nil, nil)
	descMessages = prometheus.NewDesc("dedupflow_messages_total", "Received messages by outcome.", []string{"outcome"}, nil)
	descMissing  = prometheus.NewDesc("dedupflow_missing_id_total",
		"Messages without the id attribute, by the producer attribute's value.", []string{"producer"}, nil)
)

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReceived
	ch <- descMessages
	ch <- descMissing
	m.latency.Describe(ch)
	m.storeTime.Describe(ch)
	m.handlerTime.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(m.received.Load()))
	for i, o := range outcomes {
		ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(m.outcome[i].Load()), string(o))
	}
	m.producersMu.Lock()
	for p, c := range m.producers {
		ch <- prometheus.MustNewConstMetric(descMissing, prometheus.CounterValue, float64(c.Load()), p)
	}
	m.producersMu.Unlock()
	m.latency.Collect(ch)
	m.storeTime.Collect(ch)
	m.handlerTime.Collect(ch)
}
