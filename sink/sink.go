// Package sink is the contract between the dedup pipeline and where its
// survivors go: a Message, a Sink that writes it durably, and ErrPermanent
// for a write that retrying cannot fix. The sinks themselves live beside
// it: topic (a Pub/Sub topic), postgres (a keyed upsert) and stdout.
package sink

import (
	"context"
	"sync"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
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
	// Retaken: a process may have written this key before and died (or
	// ran out its lease) before it committed it, so that write may have
	// landed. It is set when the store still held the abandoned claim, and
	// for every message in the first horizon (at least Pub/Sub's longest
	// ack deadline, 10 minutes) after the pipeline started: the memory and
	// disk stores do not keep a stopped process's claims, and a copy of one
	// of its keys may come up to a horizon later. A sink that upserts can
	// ignore it; one that appends can look the key up before writing it
	// again. A false is not a promise.
	Retaken bool
}

// Sink writes messages. Write returns only once the write is durable (a
// publish acknowledged by the server, a committed row): the input is acked
// after it, and the key recorded as done.
type Sink interface {
	Write(ctx context.Context, m *Message) error
}

// BatchSink is a Sink that also writes many messages in one call: one
// publish request, one statement, one write. It says which messages failed,
// so that only their keys are released and only they are nacked: errs[i]
// is nil once ms[i] is durable, else its error, as Write would return it.
// errs is the caller's, as long as ms; a sink keeps no reference to either
// after it returns.
//
// It is optional, beside Sink, so a Sink of its own (a test's, say) keeps
// working: WriteBatch below writes each message with Write for one without it.
type BatchSink interface {
	Sink
	WriteBatch(ctx context.Context, ms []*Message, errs []error)
}

// WriteBatch writes every ms[i] to s, setting errs[i]: in one call when s
// is a BatchSink, else one Write per message, all at once. A batch of one
// is a Write: a sink gathers the writes that arrive together (a receiver
// that hands over one message at a time makes many at once) into one
// request, which a batch call of one message would bypass.
func WriteBatch(ctx context.Context, s Sink, ms []*Message, errs []error) {
	if len(ms) == 1 {
		errs[0] = s.Write(ctx, ms[0])
		return
	}
	if bs, ok := s.(BatchSink); ok {
		bs.WriteBatch(ctx, ms, errs)
		return
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = s.Write(ctx, m) })
	}
	wg.Wait()
}

// ErrPermanent marks a sink error that retrying cannot fix (the message is
// too large for the output, say); the message goes to the dead-letter topic
// instead of coming back forever. It is dedup.ErrPermanent, which a
// consumer's handler returns for the same reason.
var ErrPermanent = dedup.ErrPermanent
