// Package outcome names what became of each message a dedupflow front end
// received, and the counts of them: the pipeline and the consumer library
// export these types (pipeline.Outcome, pipeline.Counts, consumer.Counts),
// and both count them under the same Prometheus names
// (dedupflow_messages_total{outcome} and the rest), so dashboards and
// alerts work for either.
package outcome

import (
	"context"
	"time"
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

// Acked reports whether a message with this outcome is acked. Retried and
// in-flight-conflict messages are nacked so they come back.
func (o Outcome) Acked() bool { return o != Retried && o != InFlightConflict }

// Counts is a snapshot of a front end's counters. The outcomes add up to Received once
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

// Result is what becomes of one message: its outcome and, when the outcome
// nacks it, how long its receiver holds it first, so a message that cannot
// go on yet (a key in flight elsewhere, a store or sink that is down, an
// unusable message with nowhere to go) does not come straight back.
type Result struct {
	Outcome   Outcome
	NackAfter time.Duration
}

// Delivery is a received message as a receiver settles it: a
// *pubsub.Message.
type Delivery interface {
	Ack()
	Nack()
}

// Settle applies r to d on a receiver that settles one message at a time
// (the client's callback): it acks d, or holds it for NackAfter (less if
// ctx ends first) and nacks it. A batch receiver sets the ack deadline of
// such a message to NackAfter instead.
func (r Result) Settle(ctx context.Context, d Delivery) {
	if r.Outcome.Acked() {
		d.Ack()
		return
	}
	if r.NackAfter > 0 {
		t := time.NewTimer(r.NackAfter)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
	d.Nack()
}
