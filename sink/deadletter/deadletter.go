// Package deadletter makes the dead letter of a message that cannot be
// used: the original, with the reason and its message ID in attributes,
// always within Pub/Sub's message limit. The pipeline writes these to its
// dead-letter topic.
package deadletter

import (
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/sink"
)

// Attributes a dead letter carries.
const (
	AttrError           = "dedupflow_error"
	AttrSourceMessageID = "dedupflow_source_message_id"
)

// AttrEnvelope marks a dead letter whose data is a JSON envelope holding
// the original data and attributes, used when the original already has
// too many attributes to add the reason to.
const AttrEnvelope = "dedupflow_envelope"

// AttrDataDropped, on a dead letter without data, gives the size of the
// data the original carried: with the reason it would pass Pub/Sub's
// limit, so it is left behind (the original stays in the input's backlog
// history and the publisher's logs, if anywhere).
const AttrDataDropped = "dedupflow_data_dropped_bytes"

// Of is the dead letter of m: its data and attributes, the reason
// and its message ID, within Pub/Sub's message limit: a message near the
// limit (refused at the output for the id attribute) would otherwise be
// refused by the dead-letter topic too and bounce forever. The reason is
// cut first; if the data alone does not fit beside the attributes, it is
// dropped and its size given in AttrDataDropped.
func Of(m *sink.Message, reason error) *sink.Message {
	attrs := make(map[string]string, len(m.Attributes)+3)
	enveloped := len(m.Attributes)+2 > limits.Attributes
	if !enveloped {
		for k, v := range m.Attributes {
			attrs[k] = v
		}
	} else {
		attrs[AttrEnvelope] = "json"
	}
	attrs[AttrSourceMessageID] = m.ID
	data := envelope(m.Data, m.Attributes, enveloped)
	room := limits.MessageBytes - len(AttrError) - size(data, attrs)
	if room < 0 {
		// Even without a reason the data does not fit: leave it out.
		if len(attrs) < limits.Attributes-1 { // else the reason alone says it
			attrs[AttrDataDropped] = strconv.Itoa(len(m.Data))
		}
		data = envelope(nil, m.Attributes, enveloped)
		reason = fmt.Errorf("%w; its %d bytes of data do not fit in a dead letter beside the attributes: dropped", reason, len(m.Data))
		room = limits.MessageBytes - len(AttrError) - size(data, attrs)
	}
	attrs[AttrError] = truncate(reason.Error(), min(limits.AttributeValueBytes, max(room, 0)))
	return &sink.Message{ID: m.ID, Data: data, Attributes: attrs, PublishTime: m.PublishTime, EventTime: m.EventTime}
}

// envelope is the data of a dead letter: the original's, or, when its
// attributes leave no room for the reason's, a JSON envelope of both.
func envelope(data []byte, attrs map[string]string, enveloped bool) []byte {
	if !enveloped {
		return data
	}
	env, _ := json.Marshal(struct {
		Data       []byte            `json:"data,omitempty"` // base64
		Attributes map[string]string `json:"attributes"`
	}{data, attrs})
	return env
}

// size is a message's size as Pub/Sub counts it.
func size(data []byte, attrs map[string]string) int {
	n := len(data)
	for k, v := range attrs {
		n += len(k) + len(v)
	}
	return n
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
