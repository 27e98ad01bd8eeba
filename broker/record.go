package broker

import (
	"encoding/binary"
	"errors"
	"fmt"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Log record types. A record is a type byte followed by fields encoded with
// uvarints and length-prefixed bytes; configuration travels as the
// resource's protobuf, so new fields survive without a format change.
const (
	recTopic     byte = 1  // id, Topic proto: create or update
	recTopicDel  byte = 2  // id
	recSub       byte = 3  // id, topic id (0: none), first seq, Subscription proto
	recSubDel    byte = 4  // id
	recPublish   byte = 5  // message, fanned out to the topic's subscriptions at that point
	recAck       byte = 6  // sub id, seq: the subscription is done with the message
	recSeek      byte = 7  // sub id, target time
	recHeld      byte = 8  // checkpoint: message, retained flag, ids of the subs holding it
	recCounters  byte = 9  // checkpoint: next seq, next id
	recSnap      byte = 10 // snapshot create or update, see appendSnap
	recSnapDel   byte = 11 // id
	recSeekSnap  byte = 12 // sub id, snapshot id
	recSchema    byte = 13 // schema name, all its revisions (see appendSchema)
	recSchemaDel byte = 14 // schema name
	maxRecordLen      = 64 << 20
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
	b.logRecord(recTopic, func(d []byte) []byte {
		return appendProto(binary.AppendUvarint(d, t.id), t.proto)
	})
}

func (b *Broker) logSub(s *subscription) {
	b.logRecord(recSub, func(d []byte) []byte { return appendSub(d, s) })
}

func appendSub(d []byte, s *subscription) []byte {
	var tid uint64
	if s.topic != nil {
		tid = s.topic.id
	}
	d = binary.AppendUvarint(d, s.id)
	d = binary.AppendUvarint(d, tid)
	d = binary.AppendUvarint(d, s.firstSeq)
	return appendProto(d, s.proto)
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

// applyRecord replays one record onto the state. It runs with b.mu held and
// b.replaying set, before the broker serves anything.
func (b *Broker) applyRecord(p []byte) error {
	if len(p) == 0 {
		return errCorrupt
	}
	r := &reader{p: p[1:]}
	switch p[0] {
	case recCounters:
		b.nextSeq, b.nextID = max(b.nextSeq, r.uvarint()), max(b.nextID, r.uvarint())
	case recTopic:
		id := r.uvarint()
		tp := &pb.Topic{}
		if r.err == nil {
			if err := proto.Unmarshal(r.p, tp); err != nil {
				return fmt.Errorf("topic record: %w", err)
			}
			b.putTopicLocked(id, tp)
		}
	case recTopicDel:
		if t := b.topicByID[r.uvarint()]; t != nil {
			b.deleteTopicLocked(t)
		}
	case recSub:
		id, tid, first := r.uvarint(), r.uvarint(), r.uvarint()
		sp := &pb.Subscription{}
		if r.err == nil {
			if err := proto.Unmarshal(r.p, sp); err != nil {
				return fmt.Errorf("subscription record: %w", err)
			}
			b.putSubLocked(id, b.topicByID[tid], first, sp)
		}
	case recSubDel:
		if s := b.subByID[r.uvarint()]; s != nil {
			b.deleteSubLocked(s)
		}
	case recPublish:
		m := r.message()
		if r.err == nil {
			b.nextSeq = max(b.nextSeq, m.seq+1)
			if t := b.topicByID[m.topic]; t != nil {
				b.fanoutLocked(t, m)
			}
		}
	case recHeld:
		m := r.message()
		retained := r.uvarint() == 1
		n := r.uvarint()
		for i := uint64(0); i < n && r.err == nil; i++ {
			id := r.uvarint()
			if s := b.subByID[id]; s != nil {
				s.replay.add(m)
			} else if sn := b.snapByID[id]; sn != nil {
				sn.msgs.pushBack(m) // records come in publish order
			}
		}
		if r.err == nil {
			b.nextSeq = max(b.nextSeq, m.seq+1)
			if t := b.topicByID[m.topic]; retained && t != nil {
				t.retained.pushBack(m)
			}
		}
	case recAck:
		s, seq := b.subByID[r.uvarint()], r.uvarint()
		if s != nil && r.err == nil {
			s.replay.ack(seq)
		}
	case recSeek:
		s, target := b.subByID[r.uvarint()], r.varint()
		if s != nil && r.err == nil {
			b.seekLocked(s, target)
		}
	case recSnap:
		if err := b.applySnapRecord(r); err != nil {
			return err
		}
	case recSnapDel:
		if sn := b.snapByID[r.uvarint()]; sn != nil {
			b.deleteSnapshotLocked(sn)
		}
	case recSchema:
		if err := b.applySchemaRecord(r); err != nil {
			return err
		}
	case recSchemaDel:
		delete(b.schemas, r.string())
	case recSeekSnap:
		s, sn := b.subByID[r.uvarint()], b.snapByID[r.uvarint()]
		if s != nil && sn != nil && r.err == nil {
			b.seekSnapshotLocked(s, sn)
		}
	default:
		return fmt.Errorf("unknown record type %d", p[0])
	}
	if r.err != nil {
		return fmt.Errorf("record type %d: %w", p[0], r.err)
	}
	return nil
}

// checkpoint encodes the whole live state as records: counters, topics,
// subscriptions, snapshots, then every message somebody still holds, once,
// with the subscriptions and snapshots that hold it. Replaying it rebuilds
// the state exactly.
func (b *Broker) checkpoint(emit func(typ byte, enc func([]byte) []byte) error) error {
	if err := emit(recCounters, func(d []byte) []byte {
		return binary.AppendUvarint(binary.AppendUvarint(d, b.nextSeq), b.nextID)
	}); err != nil {
		return err
	}
	if err := b.checkpointSchemas(emit); err != nil {
		return err
	}
	for _, t := range sortedByID(b.topicByID) {
		if err := emit(recTopic, func(d []byte) []byte { return appendProto(binary.AppendUvarint(d, t.id), t.proto) }); err != nil {
			return err
		}
	}
	subs := sortedByID(b.subByID)
	for _, s := range subs {
		if err := emit(recSub, func(d []byte) []byte { return appendSub(d, s) }); err != nil {
			return err
		}
	}
	type holders struct {
		m        *message
		subs     []uint64
		retained bool
	}
	live := map[uint64]*holders{}
	get := func(m *message) *holders {
		h := live[m.seq]
		if h == nil {
			h = &holders{m: m}
			live[m.seq] = h
		}
		return h
	}
	for _, s := range subs {
		s.forEachHeld(func(m *message) { h := get(m); h.subs = append(h.subs, s.id) })
	}
	if err := b.checkpointSnapshots(emit, func(m *message, id uint64) { h := get(m); h.subs = append(h.subs, id) }); err != nil {
		return err
	}
	for _, t := range b.topicByID {
		for i := 0; i < t.retained.len(); i++ {
			get(t.retained.at(i)).retained = true
		}
	}
	for _, seq := range sortedKeys(live) {
		h := live[seq]
		err := emit(recHeld, func(d []byte) []byte {
			d = appendMessage(d, h.m)
			if h.retained {
				d = append(d, 1)
			} else {
				d = append(d, 0)
			}
			d = binary.AppendUvarint(d, uint64(len(h.subs)))
			for _, id := range h.subs {
				d = binary.AppendUvarint(d, id)
			}
			return d
		})
		if err != nil {
			return err
		}
	}
	return nil
}
