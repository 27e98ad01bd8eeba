// Package outcome counts what became of the messages a dedup front end
// received: the outcome counters the pipeline and the consumer library
// share, and the Prometheus collector that exports them as
// dedupflow_received_total, dedupflow_messages_total{outcome},
// dedupflow_missing_id_total{producer} and, when messages are counted with
// their producer, dedupflow_producer_messages_total{producer,outcome}. Both front ends export the same
// names, labels and values, so dashboards and alerts work for either.
package outcome

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcome is what became of one received message.
type Outcome string

// Outcomes, as counted in dedupflow_messages_total{outcome}.
const (
	// Emitted: the message was passed on (written to the sink, or handled
	// without error); its key is committed, the message acked.
	Emitted             Outcome = "emitted"
	DuplicateRedelivery Outcome = "duplicate_redelivery"
	DuplicateRepublish  Outcome = "duplicate_republish"
	// DeadLettered: the message was unusable and moved aside.
	DeadLettered     Outcome = "dead_lettered"
	InFlightConflict Outcome = "in_flight_conflict"
	// Retried: nacked to come back later.
	Retried Outcome = "retried"
)

// all lists the outcomes in the order they are exported; Counter.outcome
// is indexed like it.
var all = [...]Outcome{Emitted, DuplicateRedelivery, DuplicateRepublish, DeadLettered, InFlightConflict, Retried}

// Acked reports whether a message with this outcome is acked. Retried and
// in-flight-conflict messages are nacked so they come back.
func (o Outcome) Acked() bool { return o != Retried && o != InFlightConflict }

// Counts is a snapshot of a Counter. The outcomes add up to Received once
// every message in flight is settled.
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

// Counter keeps the counters as atomics, read both by Snapshot and by
// Collect, so the two never disagree. Its zero value is ready to use; it
// must not be copied after first use.
type Counter struct {
	received  atomic.Int64
	outcome   [len(all)]atomic.Int64
	missingID atomic.Int64
	// Not outcomes: each of these messages is also counted under the
	// outcome it had, so the outcomes still add up to received.
	lateSuspected atomic.Int64
	tooLate       atomic.Int64

	producersMu sync.RWMutex
	producers   map[string]*producerCounts
}

// producerCounts are the counters of one producer label value.
type producerCounts struct {
	missing atomic.Int64
	counted atomic.Bool // outcomes were counted for it (CountFrom)
	outcome [len(all)]atomic.Int64
}

// Received counts one message received from the input.
func (c *Counter) Received() { c.received.Add(1) }

// Count counts one message under its outcome. An unknown outcome is not
// counted.
func (c *Counter) Count(o Outcome) {
	if i := index(o); i >= 0 {
		c.outcome[i].Add(1)
	}
}

// LateSuspected counts one emitted message the audit marked as a probable
// late duplicate.
func (c *Counter) LateSuspected() { c.lateSuspected.Add(1) }

// TooLate counts one message too late to judge in event time.
func (c *Counter) TooLate() { c.tooLate.Add(1) }

// MaxProducers is how many producer label values are kept; further values
// are counted under OtherProducers.
const MaxProducers = 100

// OtherProducers labels missing-id counts past MaxProducers values.
const OtherProducers = "other"

// CountFrom counts one message under its outcome, and under its producer
// attribute's value ("" when it has none) for
// dedupflow_producer_messages_total, so each producer's share of copies
// shows. An unknown outcome is not counted.
func (c *Counter) CountFrom(o Outcome, producer string) {
	i := index(o)
	if i < 0 {
		return
	}
	c.outcome[i].Add(1)
	p := c.producer(producer)
	p.counted.Store(true)
	p.outcome[i].Add(1)
}

// Missing counts one message without the id attribute, under the value of
// its producer attribute ("" when it has none).
func (c *Counter) Missing(producer string) {
	c.missingID.Add(1)
	c.producer(producer).missing.Add(1)
}

// producer returns the counters of a producer label value.
func (c *Counter) producer(name string) *producerCounts {
	c.producersMu.RLock()
	p, ok := c.producers[name]
	c.producersMu.RUnlock()
	if ok {
		return p
	}
	c.producersMu.Lock()
	defer c.producersMu.Unlock()
	p, ok = c.producers[name]
	if !ok && len(c.producers) >= MaxProducers {
		// The label comes from message attributes: cap it, so a producer
		// writing a fresh value per message cannot grow /metrics forever.
		name = OtherProducers
		p, ok = c.producers[name]
	}
	if !ok {
		if c.producers == nil {
			c.producers = make(map[string]*producerCounts)
		}
		p = new(producerCounts)
		c.producers[name] = p
	}
	return p
}

// Snapshot returns the counters so far.
func (c *Counter) Snapshot() Counts {
	get := func(o Outcome) int64 { return c.outcome[index(o)].Load() }
	return Counts{
		Received:            c.received.Load(),
		Emitted:             get(Emitted),
		DuplicateRedelivery: get(DuplicateRedelivery),
		DuplicateRepublish:  get(DuplicateRepublish),
		DeadLettered:        get(DeadLettered),
		InFlightConflict:    get(InFlightConflict),
		Retried:             get(Retried),
		MissingID:           c.missingID.Load(),

		LateDuplicateSuspected: c.lateSuspected.Load(),
		TooLate:                c.tooLate.Load(),
	}
}

func index(o Outcome) int {
	for i, x := range all {
		if x == o {
			return i
		}
	}
	return -1
}

var (
	descReceived = prometheus.NewDesc("dedupflow_received_total", "Messages received from the input.", nil, nil)
	descMessages = prometheus.NewDesc("dedupflow_messages_total", "Received messages by outcome.", []string{"outcome"}, nil)
	descMissing  = prometheus.NewDesc("dedupflow_missing_id_total",
		"Messages without the id attribute, by the producer attribute's value.", []string{"producer"}, nil)
	descLateSuspected = prometheus.NewDesc("dedupflow_late_duplicates_suspected_total",
		"Emitted messages whose key the audit filter saw beyond the dedup horizon (marked dedupflow_late_duplicate=probable; also counted as emitted).", nil, nil)
	descTooLate = prometheus.NewDesc("dedupflow_too_late_total",
		"Messages too late to judge in event time, passed or dead-lettered by the late policy (also counted under their outcome).", nil, nil)
	descProducer = prometheus.NewDesc("dedupflow_producer_messages_total",
		"Received messages by the producer attribute's value and outcome.", []string{"producer", "outcome"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Counter) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReceived
	ch <- descMessages
	ch <- descMissing
	ch <- descLateSuspected
	ch <- descTooLate
	ch <- descProducer
}

// Collect implements prometheus.Collector.
func (c *Counter) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descReceived, prometheus.CounterValue, float64(c.received.Load()))
	for i, o := range all {
		ch <- prometheus.MustNewConstMetric(descMessages, prometheus.CounterValue, float64(c.outcome[i].Load()), string(o))
	}
	c.producersMu.RLock()
	for name, p := range c.producers {
		if n := p.missing.Load(); n > 0 {
			ch <- prometheus.MustNewConstMetric(descMissing, prometheus.CounterValue, float64(n), name)
		}
		if p.counted.Load() {
			for i, o := range all {
				ch <- prometheus.MustNewConstMetric(descProducer, prometheus.CounterValue, float64(p.outcome[i].Load()), name, string(o))
			}
		}
	}
	c.producersMu.RUnlock()
	ch <- prometheus.MustNewConstMetric(descLateSuspected, prometheus.CounterValue, float64(c.lateSuspected.Load()))
	ch <- prometheus.MustNewConstMetric(descTooLate, prometheus.CounterValue, float64(c.tooLate.Load()))
}
