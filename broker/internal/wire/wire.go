// Package wire writes and walks, by hand, the protobuf encoding of what the
// broker keeps and streams of a message:
//
//   - a body: the message's data and attributes as the PubsubMessage fields
//     they are, made once at publish; Walk and Attr read it back without
//     decoding it, so a filter's match allocates nothing;
//   - a StreamingPull response carrying bodies to a client (AppendReceived,
//     AppendProps). Building it as protobuf structs cost five allocations
//     per message (ReceivedMessage, PubsubMessage, Timestamp, two ID
//     strings) plus a reflective walk of every attribute map, and was the
//     largest part of the broker's CPU per streamed message; encoding into
//     a buffer the stream reuses costs neither. The bytes are sent as the
//     unknown fields of an empty StreamingPullResponse, which the protobuf
//     runtime writes out verbatim.
package wire

import (
	"strconv"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

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

// AckID is the text of ack ID id, as AppendReceived writes it.
func AckID(id uint64) string { return strconv.FormatUint(id, 36) }

// AppendReceived appends one received_messages field of a StreamingPull
// response: ack ID ackID, a message of ID seq published at publish (Unix
// nanoseconds) whose data and attributes are body, its ordering key and its
// delivery attempt (0: none).
func AppendReceived(dst []byte, ackID, seq uint64, publish int64, body []byte, key string, attempt int32) []byte {
	var idBuf, msgIDBuf [16]byte
	ack := strconv.AppendUint(idBuf[:0], ackID, 36)
	msgID := strconv.AppendUint(msgIDBuf[:0], seq, 10)
	t := time.Unix(0, publish)
	secs, nanos := t.Unix(), int64(t.Nanosecond())

	tsSize := 0
	if secs != 0 {
		tsSize += protowire.SizeTag(fTimestampSeconds) + protowire.SizeVarint(uint64(secs))
	}
	if nanos != 0 {
		tsSize += protowire.SizeTag(fTimestampNanos) + protowire.SizeVarint(uint64(nanos))
	}
	msgSize := len(body) + protowire.SizeTag(fMessageID) + protowire.SizeBytes(len(msgID)) +
		protowire.SizeTag(fMessagePublishTime) + protowire.SizeBytes(tsSize)
	if key != "" {
		msgSize += protowire.SizeTag(fMessageOrderingKey) + protowire.SizeBytes(len(key))
	}
	size := protowire.SizeTag(fReceivedAckID) + protowire.SizeBytes(len(ack)) +
		protowire.SizeTag(fReceivedMessage) + protowire.SizeBytes(msgSize)
	if attempt != 0 {
		size += protowire.SizeTag(fReceivedAttempt) + protowire.SizeVarint(uint64(attempt))
	}

	dst = protowire.AppendTag(dst, fResponseMessages, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(size))
	dst = protowire.AppendTag(dst, fReceivedAckID, protowire.BytesType)
	dst = protowire.AppendBytes(dst, ack)
	dst = protowire.AppendTag(dst, fReceivedMessage, protowire.BytesType)
	dst = protowire.AppendVarint(dst, uint64(msgSize))
	dst = append(dst, body...) // data and attributes
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
	if key != "" {
		dst = protowire.AppendTag(dst, fMessageOrderingKey, protowire.BytesType)
		dst = protowire.AppendString(dst, key)
	}
	if attempt != 0 {
		dst = protowire.AppendTag(dst, fReceivedAttempt, protowire.VarintType)
		dst = protowire.AppendVarint(dst, uint64(attempt))
	}
	return dst
}

// AppendProps appends a StreamingPull response's subscription_properties.
func AppendProps(dst []byte, exactlyOnce, ordered bool) []byte {
	var props []byte
	var scratch [4]byte
	if exactlyOnce {
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

// mapEntrySize is the size of one attributes entry; key and value are
// always written, as the protobuf runtime does for map entries.
func mapEntrySize[S string | []byte](k, v S) int {
	return protowire.SizeTag(fMapKey) + protowire.SizeBytes(len(k)) +
		protowire.SizeTag(fMapValue) + protowire.SizeBytes(len(v))
}

// DataSize is the size in a body of data of n bytes (none when n is 0).
func DataSize(n int) int {
	if n == 0 {
		return 0
	}
	return protowire.SizeTag(fMessageData) + protowire.SizeBytes(n)
}

// AttrSize is the size in a body of the attribute k=v.
func AttrSize[S string | []byte](k, v S) int {
	return protowire.SizeTag(fMessageAttrs) + protowire.SizeBytes(mapEntrySize(k, v))
}

// Body encodes data and attributes as the PubsubMessage fields they are.
func Body(data []byte, attrs map[string]string) []byte {
	n := DataSize(len(data))
	for k, v := range attrs {
		n += AttrSize(k, v)
	}
	body := AppendData(make([]byte, 0, n), data)
	for k, v := range attrs {
		body = AppendAttr(body, k, v)
	}
	return body
}

// AppendData appends the data field of a body; empty data is not written.
func AppendData(body, data []byte) []byte {
	if len(data) == 0 {
		return body
	}
	body = protowire.AppendTag(body, fMessageData, protowire.BytesType)
	return protowire.AppendBytes(body, data)
}

// AppendAttr appends one attributes entry of a body (replay builds bodies
// from the log's bytes, a publish from the request's strings).
func AppendAttr[S string | []byte](body []byte, k, v S) []byte {
	body = protowire.AppendTag(body, fMessageAttrs, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(mapEntrySize(k, v)))
	body = protowire.AppendTag(body, fMapKey, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(len(k)))
	body = append(body, k...)
	body = protowire.AppendTag(body, fMapValue, protowire.BytesType)
	body = protowire.AppendVarint(body, uint64(len(v)))
	return append(body, v...)
}

// Walk calls data for the data field and attr for every attribute of a
// body that Body made; the slices alias the body. It stops at anything it
// does not expect, which Body does not write.
func Walk(body []byte, data func(p []byte), attr func(k, v []byte)) {
	for len(body) > 0 {
		num, v, rest, ok := field(body)
		if !ok {
			return
		}
		body = rest
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

// Attr finds attribute key in a body. It is written out rather than built
// on Walk so that a lookup needs no closure.
func Attr(body []byte, key string) ([]byte, bool) {
	for len(body) > 0 {
		num, v, rest, ok := field(body)
		if !ok {
			return nil, false
		}
		body = rest
		if num == fMessageAttrs {
			if k, val := mapEntry(v); string(k) == key {
				return val, true
			}
		}
	}
	return nil, false
}

// field consumes one length-delimited field of b: its number, its bytes
// (aliasing b) and the rest of b; ok is false at any other wire type or a
// malformed field, where the bodies and entries this package writes end.
func field(b []byte) (num protowire.Number, v, rest []byte, ok bool) {
	num, typ, n := protowire.ConsumeTag(b)
	if n < 0 || typ != protowire.BytesType {
		return 0, nil, nil, false
	}
	v, m := protowire.ConsumeBytes(b[n:])
	if m < 0 {
		return 0, nil, nil, false
	}
	return num, v, b[n+m:], true
}

// mapEntry decodes one attributes entry.
func mapEntry(e []byte) (k, v []byte) {
	for len(e) > 0 {
		num, f, rest, ok := field(e)
		if !ok {
			return k, v
		}
		e = rest
		switch num {
		case fMapKey:
			k = f
		case fMapValue:
			v = f
		}
	}
	return k, v
}
