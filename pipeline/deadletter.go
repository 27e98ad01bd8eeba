package pipeline

import (
	"context"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/sink"
)

// Limits of a Pub/Sub message that a dead letter must respect, or it would
// be refused and the message would loop.
const (
	maxAttributes = 100
	maxValueLen   = 1024
)

// Without a dead-letter topic an invalid message is nacked, held back
// longer at each delivery up to maxInvalidHold. The hold keeps it from
// bouncing between nack and redelivery; the cap bounds how long it takes
// a slot of --max-outstanding. As many invalid messages as slots stall
// the pipeline (before the hold, they spun it): at volume it needs a
// dead-letter topic.
const maxInvalidHold = 5 * time.Second

// AttrEnvelope marks a dead letter whose data is a JSON envelope holding
// the original data and attributes, used when the original already has
// too many attributes to add the reason to.
const AttrEnvelope = "dedupflow_envelope"

// deadLetter sends an invalid message to the dead-letter topic with the
// reason, or, without one, leaves it unacked: it is never dropped.
func (p *Pipeline) deadLetter(ctx context.Context, m *sink.Message, reason error) Outcome {
	if p.dl == nil {
		// Held back longer and reported less at each delivery, or a
		// handful of bad messages floods the log and spins the pipeline.
		p.strikes.Hold(ctx, m.ID, 100*time.Millisecond, maxInvalidHold, func(n int) {
			p.log.Warn("invalid message nacked; it comes back until it is removed: set --dead-letter-topic to move such messages aside",
				"message_id", m.ID, "deliveries", n, "reason", reason)
		})
		return Retried
	}
	if err := p.dlOut.Wait(ctx); err != nil {
		return Retried
	}
	if err := p.dl.Write(p.writeBy.ctx(), deadLetterOf(m, reason)); err != nil {
		if ctx.Err() == nil {
			p.dlOut.Fail(err)
		}
		p.log.Warn("dead-letter write failed; message nacked", "message_id", m.ID, "reason", reason, "err", err)
		return Retried
	}
	p.dlOut.OK()
	p.log.Info("message dead-lettered", "message_id", m.ID, "reason", reason)
	return DeadLettered
}

// deadLetterOf is the dead letter of m: its data and attributes, the reason
// and its message ID.
func deadLetterOf(m *sink.Message, reason error) *sink.Message {
	attrs := make(map[string]string, len(m.Attributes)+2)
	data := m.Data
	if len(m.Attributes)+2 <= maxAttributes {
		for k, v := range m.Attributes {
			attrs[k] = v
		}
	} else {
		env, _ := json.Marshal(struct {
			Data       []byte            `json:"data"` // base64
			Attributes map[string]string `json:"attributes"`
		}{m.Data, m.Attributes})
		data = env
		attrs[AttrEnvelope] = "json"
	}
	attrs[AttrError] = truncate(reason.Error(), maxValueLen)
	attrs[AttrSourceMessageID] = m.ID
	return &sink.Message{ID: m.ID, Data: data, Attributes: attrs, PublishTime: m.PublishTime, EventTime: m.EventTime}
}

// truncate cuts s to at most n bytes of valid UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}
