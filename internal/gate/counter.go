package gate

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/outcome"
)

// all lists the outcomes in the order they are exported; counter.outcome
// is indexed like it.
var all = [...]outcome.Outcome{outcome.Emitted, outcome.DuplicateRedelivery, outcome.DuplicateRepublish, outcome.DeadLettered, outcome.InFlightConflict, outcome.Retried}

// counter keeps the outcome counters as atomics, read both by Snapshot and by
// Collect, so the two never disagree. Its zero value is ready to use; it
// must not be copied after first use.
type counter struct {
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

// Received counts n messages received from the input.
func (c *counter) Received(n int) { c.received.Add(int64(n)) }

// Count counts n messages under their outcome. An unknown outcome is not
// counted.
func (c *counter) Count(o outcome.Outcome, n int) {
	if i := index(o); i >= 0 {
		c.outcome[i].Add(int64(n))
	}
}

// LateSuspected counts one emitted message the audit marked as a probable
// late duplicate.
func (c *counter) LateSuspected() { c.lateSuspected.Add(1) }

// TooLate counts one message too late to judge in event time.
func (c *counter) TooLate() { c.tooLate.Add(1) }

// maxProducers is how many producer label values are kept; further values
// are counted under otherProducers.
const maxProducers = 100

// otherProducers labels missing-id counts past maxProducers values.
const otherProducers = "other"

// CountFrom counts one message under its outcome, and under its producer
// attribute's value ("" when it has none) for
// dedupflow_producer_messages_total, so each producer's share of copies
// shows. An unknown outcome is not counted.
func (c *counter) CountFrom(o outcome.Outcome, producer string) {
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
func (c *counter) Missing(producer string) {
	c.missingID.Add(1)
	c.producer(producer).missing.Add(1)
}

// producer returns the counters of a producer label value.
func (c *counter) producer(name string) *producerCounts {
	c.producersMu.RLock()
	p, ok := c.producers[name]
	c.producersMu.RUnlock()
	if ok {
		return p
	}
	c.producersMu.Lock()
	defer c.producersMu.Unlock()
	p, ok = c.producers[name]
	if !ok && len(c.producers) >= maxProducers {
		// The label comes from message attributes: cap it, so a producer
		// writing a fresh value per message cannot grow /metrics forever.
		name = otherProducers
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
func (c *counter) Snapshot() outcome.Counts {
	get := func(o outcome.Outcome) int64 { return c.outcome[index(o)].Load() }
	return outcome.Counts{
		Received:            c.received.Load(),
		Emitted:             get(outcome.Emitted),
		DuplicateRedelivery: get(outcome.DuplicateRedelivery),
		DuplicateRepublish:  get(outcome.DuplicateRepublish),
		DeadLettered:        get(outcome.DeadLettered),
		InFlightConflict:    get(outcome.InFlightConflict),
		Retried:             get(outcome.Retried),
		MissingID:           c.missingID.Load(),

		LateDuplicateSuspected: c.lateSuspected.Load(),
		TooLate:                c.tooLate.Load(),
	}
}

func index(o outcome.Outcome) int {
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
func (c *counter) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReceived
	ch <- descMessages
	ch <- descMissing
	ch <- descLateSuspected
	ch <- descTooLate
	ch <- descProducer
}

// Collect implements prometheus.Collector.
func (c *counter) Collect(ch chan<- prometheus.Metric) {
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
