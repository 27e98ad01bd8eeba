package pipeline

import "github.com/dedupflow/dedupflow/sink/deadletter"

// Attributes the pipeline sets on dead-lettered messages (see package
// sink/deadletter, which makes them).
const (
	AttrError           = deadletter.AttrError
	AttrSourceMessageID = deadletter.AttrSourceMessageID
	// AttrEnvelope marks a dead letter whose data is a JSON envelope
	// holding the original data and attributes, used when the original
	// already has too many attributes to add the reason to.
	AttrEnvelope = deadletter.AttrEnvelope
	// AttrDataDropped, on a dead letter without data, gives the size of
	// the data the original carried.
	AttrDataDropped = deadletter.AttrDataDropped
)
