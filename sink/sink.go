// Package sink is the contract between the dedup pipeline and where its
// survivors go: a Message, a Sink that writes it durably, and ErrPermanent
// for a write that retrying cannot fix. The sinks themselves live beside
// it: topic (a Pub/Sub topic), postgres (a keyed upsert) and stdout.
package sink

import (
	"context"
	"errors"
	"time"
)

// Message is what a sink writes: a surviving input message, its dedup key
// and its event time.
type Message struct {
	ID          string // the input's service-assigned message ID
	Data        []byte
	Attributes  map[string]string
	PublishTime time.Time
	EventTime   time.Time // from the timestamp attribute, else the publish time
	// Key is the dedup key; empty for messages passed without dedup.
	Key string
}

// Sink writes messages. Write returns only once the write is durable (a
// publish acknowledged by the server, a committed row): the input is acked
// after it, and the key recorded as done.
type Sink interface {
	Write(ctx context.Context, m *Message) error
}

// ErrPermanent marks a sink error that retrying cannot fix (the message is
// too large for the output, say); the message goes to the dead-letter topic
// instead of coming back forever.
var ErrPermanent = errors.New("retrying cannot help")
