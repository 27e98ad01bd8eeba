package broker

import (
	"strconv"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/broker/internal/filter"
)

const (
	defaultRetention  = 7 * 24 * time.Hour
	minRetention      = 10 * time.Minute
	maxRetention      = 31 * 24 * time.Hour
	defaultMinBackoff = 10 * time.Second
	defaultMaxBackoff = 600 * time.Second
	// A subscription created without an expiration policy gets the
	// service's default; the service refuses a ttl under a day.
	defaultExpiration = 31 * 24 * time.Hour
	minExpiration     = 24 * time.Hour
)

// message is one published message. It is shared, read-only, by every
// subscription that holds it, so fan-out costs a pointer per subscription,
// not a copy.
//
// Data and attributes are kept in their protobuf encoding (body, see
// wire.Body), not as a slice and a map: one allocation instead of one for
// the data, two for the map and one per attribute key and value; less than
// half the memory; nothing inside for the garbage collector to scan; and a
// StreamingPull response copies it as it is.
type message struct {
	seq     uint64 // the message ID, as a number; also the global publish order
	topic   uint64 // internal ID of the topic it was published to
	publish int64  // publish time, Unix nanoseconds
	body    []byte // PubsubMessage fields data and attributes
	key     string // ordering key
	size    int    // bytes counted against flow control
}

func (m *message) id() string { return strconv.FormatUint(m.seq, 10) }

func (m *message) proto() *pb.PubsubMessage {
	return &pb.PubsubMessage{
		Data:        m.data(),
		Attributes:  m.attrs(),
		MessageId:   m.id(),
		PublishTime: timestamppb.New(time.Unix(0, m.publish)),
		OrderingKey: m.key,
	}
}

// item is an entry of a subscription's queue: a message with the number of
// times this subscription has delivered it, or (ks != nil) a token saying
// that an ordering key has messages ready.
type item struct {
	m        *message
	ks       *keyState
	attempts int32
}

// keyState holds the queued messages of one ordering key. busy counts
// messages of the key that are leased or waiting out a retry backoff; while
// it is non-zero no later message of the key is handed out, which is what
// gives one outstanding batch per key, in order.
type keyState struct {
	key    string
	q      deque[item]
	busy   int
	queued bool // a token for this key is in the ready queue
}

// lease is a delivered message waiting for its ack, or (backoff) a nacked
// message waiting for its retry policy's backoff to pass. Both sit in the
// broker's timer heap ordered by at.
type lease struct {
	id      uint64
	sub     *subscription
	it      item
	at      int64 // deadline or end of backoff, Unix nanoseconds
	hidx    int
	backoff bool
	st      *pullStream // the stream that got it, for its flow control
	cancel  func()      // ends the push request that carries it, if any
}

type topic struct {
	id         uint64
	proto      *pb.Topic
	subs       map[uint64]*subscription
	retained   deque[*message] // kept for Seek, in publish order
	retainFor  time.Duration
	snaps      map[uint64]*snapshot // snapshots taken of its subscriptions
	transforms *transforms          // nil: none, the publish path's one check
}

type subscription struct {
	id         uint64
	proto      *pb.Subscription
	topic      *topic         // nil once the topic is deleted or the sub detached
	firstSeq   uint64         // messages with a lower seq predate the subscription
	filter     *filter.Filter // nil: every message; parsed once, from proto.Filter
	transforms *transforms    // nil: none; run at each delivery
	ready      deque[item]
	keys       map[string]*keyState
	leases     map[uint64]*lease
	held       int // messages in ready, keys and leases
	waiters    map[chan struct{}]struct{}
	streams    int // open StreamingPull streams, for Overview
	// acked remembers, for exactly-once subscriptions, ack IDs acknowledged
	// in the last ackMemory, so that a client retrying an ack that did
	// succeed is told so instead of "invalid ack ID".
	acked      map[uint64]int64
	ackedOrder deque[uint64]
	// deadLettered counts messages moved to the dead-letter topic since the
	// broker started, for Overview.
	deadLettered int64
	// replay is used instead of the queues while the log is replayed.
	replay   *replaySet
	pusher   *pusher   // delivers a push subscription; nil for pull
	exporter *exporter // delivers a BigQuery or Cloud Storage subscription
}

func (s *subscription) ordered() bool     { return s.proto.EnableMessageOrdering }
func (s *subscription) exactlyOnce() bool { return s.proto.EnableExactlyOnceDelivery }

func (s *subscription) notify() {
	for ch := range s.waiters {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// retention is how long an unacknowledged message stays deliverable.
func (s *subscription) retention() time.Duration {
	if d := s.proto.MessageRetentionDuration; d != nil {
		return d.AsDuration()
	}
	return defaultRetention
}

// updateRetainFor decides how long t keeps published messages for Seek:
// the topic's own retention, or the longest of its subscriptions that
// retain acknowledged messages. Zero means nothing is kept beyond the queues.
func (t *topic) updateRetainFor() {
	var d time.Duration
	if r := t.proto.MessageRetentionDuration; r != nil {
		d = r.AsDuration()
	}
	for _, s := range t.subs {
		if s.proto.RetainAckedMessages && s.retention() > d {
			d = s.retention()
		}
	}
	t.retainFor = d
	if d == 0 {
		t.retained = deque[*message]{}
	}
}

// enqueueLocked makes it deliverable. front puts a redelivery ahead of the
// backlog, so a nacked message does not wait behind everything published
// after it.
func (s *subscription) enqueueLocked(it item, front bool) {
	if s.replay != nil {
		s.replay.add(it.m)
		return
	}
	if s.ordered() && it.m.key != "" {
		ks := s.keys[it.m.key]
		if ks == nil {
			ks = &keyState{key: it.m.key}
			s.keys[it.m.key] = ks
		}
		if front {
			ks.q.insertSorted(it, func(a, b item) bool { return a.m.seq < b.m.seq })
		} else {
			ks.q.pushBack(it)
		}
		s.readyKeyLocked(ks, front)
		return
	}
	if front {
		s.ready.pushFront(it)
	} else {
		s.ready.pushBack(it)
	}
}

// readyKeyLocked queues a token for ks when it can deliver again.
func (s *subscription) readyKeyLocked(ks *keyState, front bool) {
	if ks.busy > 0 || ks.queued {
		return
	}
	if ks.q.len() == 0 {
		delete(s.keys, ks.key)
		return
	}
	ks.queued = true
	if front {
		s.ready.pushFront(item{ks: ks})
	} else {
		s.ready.pushBack(item{ks: ks})
	}
}

// forEachHeld calls f for every message the subscription still has to get
// acknowledged, in no particular order.
func (s *subscription) forEachHeld(f func(m *message)) {
	if s.replay != nil {
		for _, m := range s.replay.held() {
			f(m)
		}
		return
	}
	for i := 0; i < s.ready.len(); i++ {
		if it := s.ready.at(i); it.m != nil {
			f(it.m)
		}
	}
	for _, ks := range s.keys {
		for i := 0; i < ks.q.len(); i++ {
			f(ks.q.at(i).m)
		}
	}
	for _, l := range s.leases {
		f(l.it.m)
	}
}

// ackMemory is how long an exactly-once subscription remembers acknowledged
// ack IDs; the Go client retries acks for at most 10 minutes.
const ackMemory = 10 * time.Minute

func (s *subscription) rememberAck(id uint64, now int64) {
	if s.acked == nil {
		s.acked = map[uint64]int64{}
	}
	s.acked[id] = now
	s.ackedOrder.pushBack(id)
	for s.ackedOrder.len() > 0 && s.acked[s.ackedOrder.front()] < now-int64(ackMemory) {
		delete(s.acked, s.ackedOrder.popFront())
	}
}

func (s *subscription) recentlyAcked(ackID string) bool {
	id, err := parseAckID(ackID)
	if err != nil {
		return false
	}
	_, ok := s.acked[id]
	return ok
}
