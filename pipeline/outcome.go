package pipeline

import "github.com/dedupflow/dedupflow/outcome"

// Outcome is what became of one received message (see package outcome,
// which the consumer library's counts share).
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

// Counts are the pipeline's counters at one moment.
type Counts = outcome.Counts

// Result is what becomes of one message: its outcome and, for a nack, how
// long its receiver holds it first (see package outcome).
type Result = outcome.Result
