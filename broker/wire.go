package broker

import (
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/encoding/protowire"
)

// delivery is one leased message on its way to a client.
type delivery struct {
	m       *message
	ackID   uint64
	attempt int32 // 0 unless the subscription has a dead-letter policy
}

func ackIDOf(id uint64) string { return strconv.FormatUint(id, 36) }

func (d delivery) proto() *pb.ReceivedMessage {
	return &pb.ReceivedMessage{AckId: ackIDOf(d.ackID), Message: d.m.proto(), DeliveryAttempt: d.attempt}
}

// Field numbers of the google.pubsub.v1 messages that StreamingPull sends.
const (
	fResponseMessages   protowire.Number = 1 // StreamingPullResponse.received_messages
	fResponseProps      protowire.Number = 4 // StreamingPullResponse.subscription_properties
	fPropsExactlyOnce   protowire.Number = 1
	fPropsOrdering      protowire.Number = 2
	fReceivedAckID      protowire.Number = 1 // ReceivedMessage
	fReceivedMessage    protowire.Number = 2
	fReceivedAttempt    protowire.Number = 3
	fMessageData        protowire.Number = 1 // PubsubMessage
	fMessageAttrs       protowire.Number = 2
	fMessageID          protowire.Number = 3
	fMessagePublishTime protowire.Number = 4
	fMessageOrderingKey protowire.Number = 5
	fMapKey             protowire.Number = 1
	fMapValue           protowire.Number = 2
	fTimestampSeconds   protowire.Number = 1
	fTimestampNanos     protowire.Number = 2
)

// appendStreamResponse encodes a StreamingPullResponse carrying ds straight
// from the broker's messages. Building it as protobuf structs cost five
// allocations per message (ReceivedMessage, PubsubMessage, Timestamp, two
// ID strings) plus a reflective walk of every attribute map, and was the
// largest part of the broker's CPU per streamed message; encoding into a
// buffer the stream reuses costs neither. The result is sent as the unknown
// fields of an empty StreamingPullResponse, which the protobuf runtime
// writes out verbatim (see sendEncoded).
func appendStreamResponse(dst []byte, ds []delivery, eod, ordered bool) []byte {
	for _, d := range ds {
		dst = protowire.AppendTag(dst, fResponseMessages, protowire.BytesType)
		dst = appendReceived(dst, d)
	}
	var props []byte
	var scratch [4]byte
	if eod {
		props = protowire.AppendTag(scratch[:0], fPropsExactlyOnce, protowire.VarintType)
		props = protowire.AppendVarint(props, 1)
	}
	if ordered {
		props = protowire.AppendTag(props, fPropsOrdering, protowire.VarintType)
		props = protowire.AppendVarint(props, 1)
	}
	// The clients read the properties from every response; an empty message
	// says "both off" just as well as an absent one, but matches the service.
	dst = protowire.AppendTag(dst, fResponseProps, protowire.BytesType)
	return protowire.AppendBytes(dst, props)
}

func appendReceived(dst []byte, d delivery) []byte {
	var idBuf, msgIDBuf [16]byte
	ackID := strconv.AppendUint(idBuf[:0], d.ackID, 36)
	msgID := strconv.AppendUint(msgIDBuf[:0], d.m.seq, 10)
	t := time.Unix(0, d.m.publish)
	secs, nanos := t.Unix(), int64(t.Nanosecond())

	tsSize := 0
	if secs != 0 {
		tsSize += protowire.SizeTag(fTimestampSeconds) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		tsSize += protowire.SizeTag(fTimestampNanos) + protowire.SizeVarint(uint64(nanos))
	}
	msgSize := len(d.m.body) + protowire.SizeTag(fMessageID) + protowire.SizeBytes(len(msgID)) +
		protowire.SizeTag(fMessagePublishTime) + protowire.SizeBytes(tsSize)
	if d.m.key != "" {
		msgSize += protowire.SizeTag(fMessageOrderingKey) + protowire.SizeBytes(len(d.m.key))
	}
	size := protowire.SizeTag(fReceivedAckID) + protowire.SizeBytes(len(ackID)) +
		protowire.SizeTag(fReceivedMessage) + protowire.SizeBytes(msgSize)
	if d.attempt != 0 {
		size += protowire.SizeTag(fReceivedAttempt) + protowire.SizeVarint(uint64(d.attempt))
	}

	dst = protowire.AppendVarint(dst, uint64(size))
	dst = protowire.AppendTag(dst, fReceivedAckID, protowire.BytesType)
	dst = protowire.AppendBytes(dst, ackID)
	dst = protowire.AppendTag(dst, fReceivedMessage, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(msgSize))
	dst = append(dst, d.m.body...) // data and attributes
	dst = protowire.AppendTag(dst, fMessageID, protowire.BytesType)
	dst = protowire.AppendBytes(dst, msgID)
	dst = protowire.AppendTag(dst, fMessagePublishTime, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(tsSize))
	if secs != 0 {
		dst = protowire.AppendTag(dst, fTimestampSeconds, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(secs))
	}
	if nanos != 0 {
		dst = protowire.AppendTag(dst, fTimestampNanos, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(nanos))
	}
	if d.m.key != "" {
		dst = protowire.AppendTag(dst, fMessageOrderingKey, protowire.BytesType)
		dst = protowire.AppendString(dst, d.m.key)
	}
	if d.attempt != 0 {
		dst = protowire.AppendTag(dst, fReceivedAttempt, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(d.attempt))
	}
	return dst
}

// mapEntrySize is the size of one attributes entry; key and value are
// always written, as the protobuf runtime does for map entries.
func mapEntrySize[S string | []byte](k, v S) int {
	return protowire.SizeTag(fMapKey) + protowire.SizeBytes(len(k)) +
		protowire.SizeTag(fMapValue) + protowire.SizeBytes(len(v))
}

// encodeBody encodes data and attributes as the PubsubMessage fields they
// are; a message keeps only this (see message).
func encodeBody(data []byte, attrs map[string]string) []byte {
	n := 0
	if len(data) > 0 {
		n += protowire.SizeTag(fMessageData) + protowire.SizeBytes(len(data))
	}
	for k, v := range attrs {
		n += protowire.SizeTag(fMessageAttrs) + protowire.SizeBytes(mapEntrySize(k, v))
	}
	body := make([]byte, 0, n)
	if len(data) > 0 {
		body = protowire.AppendTag(body, fMessageData, protowire.BytesType)
		body = protowire.AppendBytes(body, data)
	}
	for k, v := range attrs {
		body = appendAttr(body, k, v)
	}
	return body
}

// appendAttr appends one attributes entry of a body (replay builds bodies
// from the log's bytes, a publish from the request's strings).
func appendAttr[S string | []byte](body []byte, k, v S) []byte {
	body = protowire.AppendTag(body, fMessageAttrs, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(mapEntrySize(k, v)))
	body = protowire.AppendTag(body, fMapKey, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(len(k)))
	body = append(body, k...)
	body = protowire.AppendTag(body, fMapValue, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(len(v)))
	return append(body, v...)
}

// walkBody calls data for the data field and attr for every attribute of
// a body that encodeBody made; the slices alias the body. It stops at
// anything it does not expect, which encodeBody does not write.
func walkBody(body []byte, data func(p []byte), attr func(k, v []byte)) {
	for len(body) > 0 {
		num, typ, n := protowire.ConsumeTag(body)
		if n < 0 || typ != protowire.BytesType {
			return
		}
		body = body[n:]
		v, n := protowire.ConsumeBytes(body)
		if n < 0 {
			return
		}
		body = body[n:]
		switch num {
		case fMessageData:
			if data != nil {
				data(v)
			}
		case fMessageAttrs:
			if attr != nil {
				attr(mapEntry(v))
			}
		}
	}
}

// mapEntry decodes one attributes entry.
func mapEntry(e []byte) (k, v []byte) {
	for len(e) > 0 {
		num, typ, n := protowire.ConsumeTag(e)
		if n < 0 || typ != protowire.BytesType {
			return k, v
		}
		e = e[n:]
		f, n := protowire.ConsumeBytes(e)
		if n < 0 {
			return k, v
		}
		e = e[n:]
		switch num {
		case fMapKey:
			k = f
		case fMapValue:
			v = f
		}
	}
	return k, v
}

// data returns the message's data, aliasing its body; nil when empty.
func (m *message) data() []byte {
	var d []byte
	walkBody(m.body, func(p []byte) { d = p }, nil)
	return d
}

func (m *message) eachAttr(f func(k, v []byte)) { walkBody(m.body, nil, f) }

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
