package gate

import (
	"context"
	"maps"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/deadletter"
)

// The late-duplicate mark on outputs: the audit filter saw the key beyond
// the exact horizon. The filter is approximate, so the value is never
// "certain".
const (
	AttrLateDuplicate     = "dedupflow_late_duplicate"
	LateDuplicateProbable = "probable"
)

// WriteTo is a Work.Do that writes the items to s in one call, each
// carrying its key in the attribute idAttr (as Beam's
// PubsubIO.write().withIdAttribute), so a downstream reader can drop the
// rare copy a crash between a write and its commit lets through. A
// message deduped on its message ID carries dedup.MessageIDKey(ID), a
// namespace no publisher's key may use. The gate calls the sink itself,
// so a batch goes down from the pipeline and never back up into it.
func WriteTo(s sink.Sink, idAttr string) func(ctx context.Context, its []*Item, errs []error) {
	return func(ctx context.Context, its []*Item, errs []error) {
		ms := make([]*sink.Message, len(its))
		outs := make([]sink.Message, len(its)) // one allocation for the batch
		for i, it := range its {
			ms[i] = &outs[i]
			output(&outs[i], it, idAttr)
		}
		sink.WriteBatch(ctx, s, ms, errs)
	}
}

// output sets m to the output of it.
func output(m *sink.Message, it *Item, idAttr string) {
	in := it.In
	*m = sink.Message{ID: in.ID, Data: in.Data, Attributes: in.Attributes, PublishTime: in.PublishTime,
		EventTime: it.EventTime, Key: it.Key, Retaken: it.Retaken}
	if it.Key == "" || !it.LateDuplicate && in.Attributes[idAttr] == it.Key {
		// Nothing to add: most often the key came in the attribute the
		// output carries it in. Sinks only read the map.
		return
	}
	// A copy: the input's map stays as it came, for a dead letter after
	// a permanent write error. maps.Clone copies a small map's table in
	// one go, cheaper than inserting each attribute.
	attrs := maps.Clone(in.Attributes)
	if attrs == nil {
		attrs = make(map[string]string, 2)
	}
	attrs[idAttr] = it.Key
	if it.LateDuplicate {
		attrs[AttrLateDuplicate] = LateDuplicateProbable
	}
	m.Attributes = attrs
}

// DeadLetterTo is a Reject that writes the dead letters of ins (see
// package sink/deadletter), each with its reason, to s in one call.
func DeadLetterTo(s sink.Sink) func(ctx context.Context, ins []*pubsub.Message, reasons, errs []error) {
	return func(ctx context.Context, ins []*pubsub.Message, reasons, errs []error) {
		ms := make([]*sink.Message, len(ins))
		for i, in := range ins {
			m := &sink.Message{ID: in.ID, Data: in.Data, Attributes: in.Attributes, PublishTime: in.PublishTime, EventTime: in.PublishTime}
			ms[i] = deadletter.Of(m, reasons[i])
		}
		sink.WriteBatch(ctx, s, ms, errs)
	}
}
