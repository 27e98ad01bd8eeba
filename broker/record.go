package broker

import (
	"encoding/binary"
	"io"
	"slices"

	"github.com/dedupflow/dedupflow/broker/internal/logframe"
	"github.com/dedupflow/dedupflow/broker/internal/wire"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/protobuf/proto"
)

func appendMessage(dst []byte, m *message) []byte {
	dst = binary.AppendUvarint(dst, m.seq)
	dst = binary.AppendUvarint(dst, m.topic)
	dst = binary.AppendVarint(dst, m.publish)
	dst = logframe.AppendString(dst, m.key)
	dst = logframe.AppendBytes(dst, m.data())
	dst = binary.AppendUvarint(dst, uint64(m.numAttrs()))
	m.eachAttr(func(k, v []byte) {
		dst = logframe.AppendBytes(dst, k)
		dst = logframe.AppendBytes(dst, v)
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
	start := len(w.buf)
	w.buf = enc(append(logframe.Begin(w.buf), typ))
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
type reader struct{ logframe.Decoder }

// message decodes what appendMessage wrote. The attributes are read twice,
// once to size the body and once to encode it, so that building the body
// allocates only the body itself.
func (r *reader) message() *message {
	m := &message{seq: r.Uvarint(), topic: r.Uvarint(), publish: r.Varint()}
	m.key = r.Text()
	data := r.Bytes()
	n := r.Uvarint()
	if n > limits.Attributes*2 {
		r.Err = logframe.ErrCorrupt
		return nil
	}
	attrs := *r
	size, bodyLen := len(data)+len(m.key), wire.DataSize(len(data))
	for i := uint64(0); i < n && r.Err == nil; i++ {
		k, v := r.Bytes(), r.Bytes()
		size += len(k) + len(v)
		bodyLen += wire.AttrSize(k, v)
	}
	if r.Err != nil {
		return nil
	}
	body := wire.AppendData(make([]byte, 0, bodyLen), data)
	for i := uint64(0); i < n; i++ {
		body = wire.AppendAttr(body, attrs.Bytes(), attrs.Bytes())
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

// appendFrame appends one framed record (see logframe) built by enc.
func appendFrame(dst []byte, typ byte, enc func([]byte) []byte) []byte {
	return logframe.Append(dst, func(d []byte) []byte { return enc(append(d, typ)) })
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
