package pipeline

import (
	"context"
	"encoding/json"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/sink"
)

// AttrEnvelope marks a dead letter whose data is a JSON envelope holding
// the original data and attributes, used when the original already has
// too many attributes to add the reason to.
const AttrEnvelope = "dedupflow_envelope"

// deadLetter is the gate's Reject: an unusable message, with the reason,
// to the dead-letter topic.
func (p *Pipeline) deadLetter(_ context.Context, in *pubsub.Message, reason error) error {
	m := &sink.Message{ID: in.ID, Data: in.Data, Attributes: in.Attributes, PublishTime: in.PublishTime, EventTime: in.PublishTime}
	return p.dl.Write(p.gate.Deadline(), deadLetterOf(m, reason))
}

// deadLetterOf is the dead letter of m: its data and attributes, the reason
// and its message ID.
func deadLetterOf(m *sink.Message, reason error) *sink.Message {
	attrs := make(map[string]string, len(m.Attributes)+2)
	data := m.Data
	if len(m.Attributes)+2 <= limits.Attributes {
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
	attrs[AttrError] = truncate(reason.Error(), limits.AttributeValueBytes)
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
