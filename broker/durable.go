package broker

import (
	"encoding/binary"
	"fmt"
	"maps"
	"slices"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/logframe"
	"github.com/dedupflow/dedupflow/broker/internal/schemacheck"
	"google.golang.org/protobuf/proto"
)

// Durable state is this one table: every record kind of the log, how it is
// replayed, and how a checkpoint writes the state it carries. Replay and
// checkpoint both walk it, so a kind cannot be left out of either. The
// types, written out because they are on disk, run 1..N without gaps, and
// every rec constant has its row: TestRecordKinds reads the constants from
// the source and holds both (TestCompactionKeepsEveryKind then replays each).
//
// A record is a type byte followed by fields encoded with uvarints and
// length-prefixed bytes; configuration travels as the resource's protobuf,
// so new fields survive without a format change.
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
	recPolicy    byte = 15 // resource name, IAM Policy proto
)

// recordKind is one row of the table.
type recordKind struct {
	typ  byte
	name string
	// apply replays one record onto the state, with b.mu held and
	// b.replaying set.
	apply func(b *Broker, r *reader) error
	// save writes the live state of this kind into a checkpoint. A kind
	// without save is an event whose effect the saved state already holds;
	// folded says which state that is.
	save   func(b *Broker, cp *capture)
	folded string
}

// recordKinds is in checkpoint order: a record may refer to the ones
// before it (a subscription to its topic, a snapshot to both).
var recordKinds = []recordKind{
	{typ: recCounters, name: "counters", apply: applyCounters, save: saveCounters},
	{typ: recSchema, name: "schema", apply: applySchema, save: saveSchemas},
	{typ: recSchemaDel, name: "schema deletion", apply: applySchemaDel, folded: "schema"},
	{typ: recTopic, name: "topic", apply: applyTopic, save: saveTopics},
	{typ: recTopicDel, name: "topic deletion", apply: applyTopicDel, folded: "topic"},
	{typ: recSub, name: "subscription", apply: applySub, save: saveSubs},
	{typ: recSubDel, name: "subscription deletion", apply: applySubDel, folded: "subscription"},
	{typ: recSnap, name: "snapshot", apply: applySnap, save: saveSnaps},
	{typ: recSnapDel, name: "snapshot deletion", apply: applySnapDel, folded: "snapshot"},
	{typ: recPolicy, name: "IAM policy", apply: applyPolicy, save: savePolicies},
	{typ: recPublish, name: "publish", apply: applyPublish, folded: "held message"},
	{typ: recAck, name: "ack", apply: applyAck, folded: "held message"},
	{typ: recSeek, name: "seek", apply: applySeek, folded: "held message"},
	{typ: recSeekSnap, name: "seek to snapshot", apply: applySeekSnap, folded: "held message"},
	// Written by capture.write from what the kinds above hold.
	{typ: recHeld, name: "held message", apply: applyHeld, folded: "its own: capture.write"},
}

// recordKindByType indexes recordKinds by type byte.
var recordKindByType = func() (idx [256]*recordKind) {
	for i := range recordKinds {
		idx[recordKinds[i].typ] = &recordKinds[i]
	}
	return idx
}()

// applyRecord replays one record onto the state. It runs with b.mu held and
// b.replaying set, before the broker serves anything.
func (b *Broker) applyRecord(p []byte) error {
	if len(p) == 0 {
		return logframe.ErrCorrupt
	}
	k := recordKindByType[p[0]]
	if k == nil {
		return fmt.Errorf("unknown record type %d", p[0])
	}
	r := &reader{logframe.Decoder{P: p[1:]}}
	if err := k.apply(b, r); err != nil {
		return fmt.Errorf("%s record: %w", k.name, err)
	}
	if r.Err != nil {
		return fmt.Errorf("%s record: %w", k.name, r.Err)
	}
	return nil
}

// captureLocked takes the capture: each kind's saved state as records, and
// a pointer per holding. It costs a copy of pointers; the encoding of the
// messages happens in write.
func (b *Broker) captureLocked() *capture {
	cp := &capture{}
	for _, k := range recordKinds {
		if k.save != nil {
			k.save(b, cp)
		}
	}
	return cp
}

func (cp *capture) emit(typ byte, enc func([]byte) []byte) {
	cp.head = appendFrame(cp.head, typ, enc)
}

func (cp *capture) hold(m *message, id uint64) {
	cp.held = append(cp.held, holding{m: m, id: id})
}

func applyCounters(b *Broker, r *reader) error {
	b.nextSeq, b.nextID = max(b.nextSeq, r.Uvarint()), max(b.nextID, r.Uvarint())
	return nil
}

func saveCounters(b *Broker, cp *capture) { cp.emit(recCounters, b.appendCounters) }

func (b *Broker) appendCounters(d []byte) []byte {
	return binary.AppendUvarint(binary.AppendUvarint(d, b.nextSeq), b.nextID)
}

func appendTopic(d []byte, t *topic) []byte {
	return appendProto(binary.AppendUvarint(d, t.id), t.proto)
}

func applyTopic(b *Broker, r *reader) error {
	id := r.Uvarint()
	tp := &pb.Topic{}
	if r.Err != nil {
		return nil
	}
	if err := proto.Unmarshal(r.P, tp); err != nil {
		return err
	}
	b.putTopicLocked(id, tp)
	return nil
}

// saveTopics writes every topic, and holds what each retains for Seek.
func saveTopics(b *Broker, cp *capture) {
	for _, t := range sortedByID(b.topicByID) {
		cp.emit(recTopic, func(d []byte) []byte { return appendTopic(d, t) })
		for i := 0; i < t.retained.len(); i++ {
			cp.held = append(cp.held, holding{m: t.retained.at(i), retained: true})
		}
	}
}

func applyTopicDel(b *Broker, r *reader) error {
	if t := b.topicByID[r.Uvarint()]; t != nil {
		b.deleteTopicLocked(t)
	}
	return nil
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

func applySub(b *Broker, r *reader) error {
	id, tid, first := r.Uvarint(), r.Uvarint(), r.Uvarint()
	sp := &pb.Subscription{}
	if r.Err != nil {
		return nil
	}
	if err := proto.Unmarshal(r.P, sp); err != nil {
		return err
	}
	b.putSubLocked(id, b.topicByID[tid], first, sp)
	return nil
}

// saveSubs writes every subscription, and holds its backlog.
func saveSubs(b *Broker, cp *capture) {
	subs := sortedByID(b.subByID)
	n := 0
	for _, s := range subs {
		cp.emit(recSub, func(d []byte) []byte { return appendSub(d, s) })
		n += s.held
	}
	cp.held = slices.Grow(cp.held, n)
	for _, s := range subs {
		s.forEachHeld(func(m *message) { cp.hold(m, s.id) })
	}
}

func applySubDel(b *Broker, r *reader) error {
	if s := b.subByID[r.Uvarint()]; s != nil {
		b.deleteSubLocked(s)
	}
	return nil
}

// appendSnap encodes a snapshot record: id, topic id (0: none), the
// subscription whose backlog it took (0: its messages follow in recHeld
// records, as in a checkpoint), the time it was taken, the Snapshot proto.
func appendSnap(d []byte, sn *snapshot, subID uint64, taken int64) []byte {
	var tid uint64
	if sn.topic != nil {
		tid = sn.topic.id
	}
	d = binary.AppendUvarint(d, sn.id)
	d = binary.AppendUvarint(d, tid)
	d = binary.AppendUvarint(d, subID)
	d = binary.AppendVarint(d, taken)
	return appendProto(d, sn.proto)
}

// applySnap replays a recSnap: an update of an existing snapshot's
// settings, or a new snapshot.
func applySnap(b *Broker, r *reader) error {
	id, tid, subID, taken := r.Uvarint(), r.Uvarint(), r.Uvarint(), r.Varint()
	if r.Err != nil {
		return nil
	}
	sp := &pb.Snapshot{}
	if err := proto.Unmarshal(r.P, sp); err != nil {
		return err
	}
	if sn := b.snapByID[id]; sn != nil {
		sn.proto = sp
		return nil
	}
	if s := b.subByID[subID]; s != nil {
		b.newSnapshotLocked(id, s, taken, sp)
		return nil
	}
	b.putSnapshotLocked(id, b.topicByID[tid], sp)
	return nil
}

// saveSnaps writes every snapshot's settings; their messages go into the
// recHeld records, which list snapshot IDs beside subscription IDs.
func saveSnaps(b *Broker, cp *capture) {
	for _, sn := range sortedByID(b.snapByID) {
		cp.emit(recSnap, func(d []byte) []byte { return appendSnap(d, sn, 0, 0) })
		for i := 0; i < sn.msgs.len(); i++ {
			cp.hold(sn.msgs.at(i), sn.id)
		}
	}
}

func applySnapDel(b *Broker, r *reader) error {
	if sn := b.snapByID[r.Uvarint()]; sn != nil {
		b.deleteSnapshotLocked(sn)
	}
	return nil
}

// appendSchema encodes all revisions of s, oldest first.
func appendSchema(d []byte, s *schema) []byte {
	all := &pb.ListSchemaRevisionsResponse{}
	for _, r := range s.revs {
		all.Schemas = append(all.Schemas, r.proto)
	}
	return appendProto(logframe.AppendString(d, s.name), all)
}

// applySchema replays a recSchema, parsing each revision again.
func applySchema(b *Broker, r *reader) error {
	name := r.Text()
	all := &pb.ListSchemaRevisionsResponse{}
	if r.Err != nil {
		return nil
	}
	if err := proto.Unmarshal(r.P, all); err != nil {
		return err
	}
	s := &schema{name: name}
	for _, sp := range all.Schemas {
		check, err := schemacheck.Parse(sp.Type, sp.Definition)
		if err != nil {
			return fmt.Errorf("schema %s revision %s no longer parses: %w", name, sp.RevisionId, err)
		}
		s.revs = append(s.revs, &schemaRev{proto: sp, check: check})
	}
	if len(s.revs) > 0 {
		b.putSchemaLocked(s)
	}
	return nil
}

func saveSchemas(b *Broker, cp *capture) {
	for _, n := range slices.Sorted(maps.Keys(b.schemas)) {
		cp.emit(recSchema, func(d []byte) []byte { return appendSchema(d, b.schemas[n]) })
	}
}

func applySchemaDel(b *Broker, r *reader) error {
	if s := b.schemas[r.Text()]; s != nil {
		b.deleteSchemaLocked(s)
	}
	return nil
}

func applyPublish(b *Broker, r *reader) error {
	m := r.message()
	if r.Err == nil {
		b.nextSeq = max(b.nextSeq, m.seq+1)
		if t := b.topicByID[m.topic]; t != nil {
			b.fanoutLocked(t, m)
		}
	}
	return nil
}

func applyHeld(b *Broker, r *reader) error {
	m := r.message()
	retained := r.Uvarint() == 1
	n := r.Uvarint()
	for i := uint64(0); i < n && r.Err == nil; i++ {
		id := r.Uvarint()
		if s := b.subByID[id]; s != nil {
			s.replay.add(m)
		} else if sn := b.snapByID[id]; sn != nil {
			sn.msgs.pushBack(m) // records come in publish order
		}
	}
	if r.Err == nil {
		b.nextSeq = max(b.nextSeq, m.seq+1)
		if t := b.topicByID[m.topic]; retained && t != nil {
			t.retained.pushBack(m)
		}
	}
	return nil
}

func applyAck(b *Broker, r *reader) error {
	s, seq := b.subByID[r.Uvarint()], r.Uvarint()
	if s != nil && r.Err == nil {
		s.replay.ack(seq)
	}
	return nil
}

func applySeek(b *Broker, r *reader) error {
	s, target := b.subByID[r.Uvarint()], r.Varint()
	if s != nil && r.Err == nil {
		b.seekLocked(s, target)
	}
	return nil
}

func applySeekSnap(b *Broker, r *reader) error {
	s, sn := b.subByID[r.Uvarint()], b.snapByID[r.Uvarint()]
	if s != nil && sn != nil && r.Err == nil {
		b.seekSnapshotLocked(s, sn)
	}
	return nil
}

func appendPolicy(d []byte, resource string, p *iampb.Policy) []byte {
	return appendProto(logframe.AppendString(d, resource), p)
}

func applyPolicy(b *Broker, r *reader) error {
	resource := r.Text()
	p := &iampb.Policy{}
	if r.Err != nil {
		return nil
	}
	if err := proto.Unmarshal(r.P, p); err != nil {
		return err
	}
	b.putPolicyLocked(resource, p)
	return nil
}

func savePolicies(b *Broker, cp *capture) {
	for _, n := range slices.Sorted(maps.Keys(b.policies)) {
		cp.emit(recPolicy, func(d []byte) []byte { return appendPolicy(d, n, b.policies[n]) })
	}
}
