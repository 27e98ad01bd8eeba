package broker

import (
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/broker/internal/wire"
)

// delivery is one leased message on its way to a client.
type delivery struct {
	m       *message
	ackID   uint64
	attempt int32 // 0 unless the subscription has a dead-letter policy
}

func ackIDOf(id uint64) string { return wire.AckID(id) }

func (d delivery) proto() *pb.ReceivedMessage {
	return &pb.ReceivedMessage{AckId: ackIDOf(d.ackID), Message: d.m.proto(), DeliveryAttempt: d.attempt}
}

// appendStreamResponse encodes a StreamingPullResponse carrying ds straight
// from the broker's messages, into a buffer the stream reuses (see
// package wire and sendEncoded).
func appendStreamResponse(dst []byte, ds []delivery, eod, ordered bool) []byte {
	for _, d := range ds {
		dst = wire.AppendReceived(dst, d.ackID, d.m.seq, d.m.publish, d.m.body, d.m.key, d.attempt)
	}
	return wire.AppendProps(dst, eod, ordered)
}

// data returns the message's data, aliasing its body; nil when empty.
func (m *message) data() []byte {
	var d []byte
	wire.Walk(m.body, func(p []byte) { d = p }, nil)
	return d
}

func (m *message) eachAttr(f func(k, v []byte)) { wire.Walk(m.body, nil, f) }

func (m *message) numAttrs() int {
	n := 0
	m.eachAttr(func(_, _ []byte) { n++ })
	return n
}

// attrs decodes the attributes into a new map; nil when there are none.
func (m *message) attrs() map[string]string {
	var a map[string]string
	m.eachAttr(func(k, v []byte) {
		if a == nil {
			a = map[string]string{}
		}
		a[string(k)] = string(v)
	})
	return a
}
