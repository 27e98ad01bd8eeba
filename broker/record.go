package broker

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"slices"

	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

func appendBytes(dst, p []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(p)))
	return append(dst, p...)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendMessage(dst []byte, m *message) []byte {
	dst = binary.AppendUvarint(dst, m.seq)
	dst = binary.AppendUvarint(dst, m.topic)
	dst = binary.AppendVarint(dst, m.publish)
	dst = appendString(dst, m.key)
	dst = appendBytes(dst, m.data())
	dst = binary.AppendUvarint(dst, uint64(m.numAttrs()))
	m.eachAttr(func(k, v []byte) {
		dst = appendBytes(dst, k)
		dst = appendBytes(dst, v)
	})
	return dst
}

// logging is off in memory mode and while the log itself is replayed.
func (b *Broker) logging() bool { return b.wal != nil && !b.replaying }

// logRecord appends one record built by enc. It is called with b.mu held.
func (b *Broker) logRecord(typ byte, enc func([]byte) []byte) {
	if !b.logging() {
		return
	}
	w := b.wal
	w.mu.Lock()
	start := w.begin()
	w.buf = append(w.buf, typ)
	w.buf = enc(w.buf)
	w.finish(start)
	w.mu.Unlock()
}

func (b *Broker) logPublish(m *message) {
	b.logRecord(recPublish, func(d []byte) []byte { return appendMessage(d, m) })
}

func (b *Broker) logAck(s *subscription, seq uint64) {
	b.logRecord(recAck, func(d []byte) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(d, s.id), seq)
	})
}

func (b *Broker) logSeek(s *subscription, target int64) {
	b.logRecord(recSeek, func(d []byte) []byte {
		return binary.AppendVarint(binary.AppendUvarint(d, s.id), target)
	})
}

func appendProto(d []byte, m proto.Message) []byte {
	p, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		// Marshalling a message the broker built itself cannot fail; if it
		// ever does, an empty proto is replayed rather than a corrupt log.
		return d
	}
	return append(d, p...)
}

func (b *Broker) logTopic(t *topic) {
	b.logRecord(recTopic, func(d []byte) []byte { return appendTopic(d, t) })
}

func (b *Broker) logSub(s *subscription) {
	b.logRecord(recSub, func(d []byte) []byte { return appendSub(d, s) })
}

func (b *Broker) logDelete(typ byte, id uint64) {
	b.logRecord(typ, func(d []byte) []byte { return binary.AppendUvarint(d, id) })
}

// reader decodes one record payload; the first error sticks.
type reader struct {
	p   []byte
	err error
}

var errCorrupt = errors.New("corrupt record")

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.p)
	if n <= 0 {
		r.err = errCorrupt
		return 0
	}
	r.p = r.p[n:]
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.p)
	if n <= 0 {
		r.err = errCorrupt
		return 0
	}
	r.p = r.p[n:]
	return v
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.p)) {
		r.err = errCorrupt
		return nil
	}
	v := r.p[:n:n]
	r.p = r.p[n:]
	return v
}

func (r *reader) string() string { return string(r.bytes()) }

// message decodes what appendMessage wrote. The attributes are read twice,
// once to size the body and once to encode it, so that building the body
// allocates only the body itself.
func (r *reader) message() *message {
	m := &message{seq: r.uvarint(), topic: r.uvarint(), publish: r.varint()}
	m.key = r.string()
	data := r.bytes()
	n := r.uvarint()
	if n > limits.Attributes*2 {
		r.err = errCorrupt
		return nil
	}
	attrs := *r
	size, bodyLen := len(data)+len(m.key), 0
	if len(data) > 0 {
		bodyLen = protowire.SizeTag(fMessageData) + protowire.SizeBytes(len(data))
	}
	for i := uint64(0); i < n && r.err == nil; i++ {
		k, v := r.bytes(), r.bytes()
		size += len(k) + len(v)
		bodyLen += protowire.SizeTag(fMessageAttrs) + protowire.SizeBytes(mapEntrySize(k, v))
	}
	if r.err != nil {
		return nil
	}
	body := make([]byte, 0, bodyLen)
	if len(data) > 0 {
		body = protowire.AppendTag(body, fMessageData, protowire.BytesType)
		body = protowire.AppendBytes(body, data)
	}
	for i := uint64(0); i < n; i++ {
		body = appendAttr(body, attrs.bytes(), attrs.bytes())
	}
	m.body, m.size = body, size
	return m
}

// capture is the live state as a checkpoint writes it: the configuration
// records, encoded while the state is locked, and every held message with
// who holds it, encoded after.
type capture struct {
	head []byte
	held []holding
}

// holding says that a subscription or snapshot (id), or the topic's
// retention (retained), holds m.
type holding struct {
	m        *message
	id       uint64
	retained bool
}

// appendFrame appends one framed record (see wal) built by enc.
func appendFrame(dst []byte, typ byte, enc func([]byte) []byte) []byte {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0, typ)
	dst = enc(dst)
	binary.LittleEndian.PutUint32(dst[start:], uint32(len(dst)-start-8))
	binary.LittleEndian.PutUint32(dst[start+4:], crc32.Checksum(dst[start+8:], crcTable))
	return dst
}

// write writes the checkpoint: the head, then one recHeld record per held
// message in publish order, listing its holders. Replaying it rebuilds the
// captured state exactly. It gives up with errClosed when stop is closed.
func (cp *capture) write(w io.Writer, stop <-chan struct{}) (int64, error) {
	// Queues are mostly in publish order already, which the sort exploits.
	slices.SortFunc(cp.held, func(a, b holding) int { return cmpSeq(a.m.seq, b.m.seq) })
	size := int64(len(cp.head))
	if _, err := w.Write(cp.head); err != nil {
		return 0, err
	}
	var frame []byte
	var ids []uint64
	for i := 0; i < len(cp.held); {
		if i%4096 == 0 {
			select {
			case <-stop:
				return 0, errClosed
			default:
			}
		}
		m, retained := cp.held[i].m, false
		ids = ids[:0]
		for ; i < len(cp.held) && cp.held[i].m.seq == m.seq; i++ {
			if cp.held[i].retained {
				retained = true
			} else {
				ids = append(ids, cp.held[i].id)
			}
		}
		frame = appendFrame(frame[:0], recHeld, func(d []byte) []byte {
			d = appendMessage(d, m)
			if retained {
				d = append(d, 1)
			} else {
				d = append(d, 0)
			}
			d = binary.AppendUvarint(d, uint64(len(ids)))
			for _, id := range ids {
				d = binary.AppendUvarint(d, id)
			}
			return d
		})
		size += int64(len(frame))
		if _, err := w.Write(frame); err != nil {
			return 0, err
		}
	}
	return size, nil
}
