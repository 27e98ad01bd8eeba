package broker

import (
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/broker/internal/wire"
)

// The functions in this file change the delivery state. They all run with
// b.mu held and append the matching log record in the same critical section,
// so the log order is the order in which the state changed.

// Dead-letter attributes, as the official emulator sets them.
const (
	attrDLDeliveryCount = "CloudPubSubDeadLetterSourceDeliveryCount"
	attrDLSubscription  = "CloudPubSubDeadLetterSourceSubscription"
	attrDLProject       = "CloudPubSubDeadLetterSourceSubscriptionProject"
	attrDLPublishTime   = "CloudPubSubDeadLetterSourceTopicPublishTime"
	attrDLDeliveryError = "CloudPubSubDeadLetterSourceDeliveryErrorMessage"
)

func (b *Broker) nowNanos() int64 { return b.now().UnixNano() }

// unixNanos is a time from a request in Unix nanoseconds, pinned to the
// ends of int64's range for times outside the years 1678-2262, where
// UnixNano overflows: a user may give any time from year 1 to 9999, and
// publish times, which are always in range, compare with the pinned value
// as they would with the time itself.
func unixNanos(t time.Time) int64 {
	switch {
	case t.Before(time.Unix(0, math.MinInt64)):
		return math.MinInt64
	case t.After(time.Unix(0, math.MaxInt64)):
		return math.MaxInt64
	}
	return t.UnixNano()
}

// publishLocked stores a new message on t and hands it to every attached
// subscription. body is what wire.Body made of the data and attributes,
// size is what checkMessage computed.
func (b *Broker) publishLocked(t *topic, body []byte, key string, size int, now int64) *message {
	m := &message{seq: b.nextSeq, topic: t.id, publish: now, body: body, key: key, size: size}
	b.nextSeq++
	b.logPublish(m)
	b.fanoutLocked(t, m)
	return m
}

func (b *Broker) fanoutLocked(t *topic, m *message) {
	for _, s := range t.subs {
		// A message the filter rejects is acknowledged at once, as in the
		// service: it is never queued, so every delivery path skips it.
		if !s.filter.Match(m.body) {
			continue
		}
		s.held++
		s.enqueueLocked(item{m: m}, false)
		s.notify()
	}
	if t.retainFor > 0 {
		t.retained.pushBack(m)
	}
	for _, sn := range t.snaps {
		sn.msgs.pushBack(m)
	}
}

// deliverLocked leases up to maxMsgs messages of s, stopping before maxBytes
// would be exceeded (the first message always goes, so that a message larger
// than the budget cannot block the subscription).
func (b *Broker) deliverLocked(s *subscription, maxMsgs, maxBytes int, deadline time.Duration, st *pullStream, out []delivery) []delivery {
	now := b.nowNanos()
	cutoff := now - int64(s.retention())
	base := len(out)
	maxMsgs += base
	bytes := 0
	fits := func(m *message) bool { return len(out) == base || bytes+m.size <= maxBytes }
	for len(out) < maxMsgs && s.ready.len() > 0 {
		it := s.ready.front()
		if it.m != nil {
			if it.m.publish < cutoff {
				s.ready.popFront()
				b.finishLocked(s, it.m)
				continue
			}
			if !fits(it.m) {
				break
			}
			s.ready.popFront()
			out = append(out, b.leaseLocked(s, it, now, deadline, st))
			bytes += it.m.size
			continue
		}
		// An ordering key's token: hand out what the key has queued, as one
		// batch; the key stays busy until all of it is acknowledged.
		ks := it.ks
		full := false
		for ks.q.len() > 0 && len(out) < maxMsgs {
			ki := ks.q.front()
			if ki.m.publish < cutoff {
				ks.q.popFront()
				b.finishLocked(s, ki.m)
				continue
			}
			if !fits(ki.m) {
				full = true
				break
			}
			ks.q.popFront()
			ks.busy++
			out = append(out, b.leaseLocked(s, ki, now, deadline, st))
			bytes += ki.m.size
		}
		if full && ks.busy == 0 {
			break // the token stays at the front for the next pull
		}
		s.ready.popFront()
		ks.queued = false
		s.readyKeyLocked(ks, false)
	}
	return out
}

func (b *Broker) leaseLocked(s *subscription, it item, now int64, deadline time.Duration, st *pullStream) delivery {
	it.attempts++
	b.nextLease++
	l := &lease{id: b.nextLease, sub: s, it: it, at: now + int64(deadline), st: st}
	s.leases[l.id] = l
	b.timers.push(l)
	if st != nil {
		st.outMsgs++
		st.outBytes += it.m.size
	}
	d := delivery{m: it.m, ackID: l.id}
	if s.proto.DeadLetterPolicy != nil {
		d.attempt = it.attempts
	}
	return d
}

// lookupLease finds the live lease behind an ack ID, or nil when the ID is
// unknown, expired, already acknowledged or waiting out a backoff.
func (s *subscription) lookupLease(ackID string) *lease {
	id, err := parseAckID(ackID)
	if err != nil {
		return nil
	}
	l := s.leases[id]
	if l == nil || l.backoff {
		return nil
	}
	return l
}

// parseAckID reads an ack ID: a lease ID in base 36.
func parseAckID(ackID string) (uint64, error) { return strconv.ParseUint(ackID, 36, 64) }

// checkAckIDs refuses an empty list or an ack ID that does not parse, with
// the service's texts.
func checkAckIDs(ackIDs []string) error {
	if len(ackIDs) == 0 {
		return status.Error(codes.InvalidArgument, "No ack ids specified.")
	}
	for _, id := range ackIDs {
		if _, err := parseAckID(id); err != nil {
			return status.Errorf(codes.InvalidArgument, "Invalid ack id (ack_id=%.100s)", id)
		}
	}
	return nil
}

// endLeaseLocked forgets l and gives its flow-control budget back to the
// stream that received it.
func (b *Broker) endLeaseLocked(l *lease) {
	delete(l.sub.leases, l.id)
	b.timers.remove(l)
	if l.cancel != nil {
		l.cancel()
		l.cancel = nil
	}
	if st := l.st; st != nil {
		st.outMsgs--
		st.outBytes -= l.it.m.size
		st.wakeUp()
		l.st = nil
	}
}

// finishLocked records that s is done with m (acknowledged, expired by
// retention or dead-lettered).
func (b *Broker) finishLocked(s *subscription, m *message) {
	s.held--
	b.logAck(s, m.seq)
}

func (b *Broker) ackLeaseLocked(l *lease) {
	s := l.sub
	b.endLeaseLocked(l)
	b.finishLocked(s, l.it.m)
	b.releaseKeyLocked(s, l.it.m)
}

// releaseKeyLocked lets an ordering key deliver again once its last
// outstanding message is resolved.
func (b *Broker) releaseKeyLocked(s *subscription, m *message) {
	if !s.ordered() || m.key == "" {
		return
	}
	if ks := s.keys[m.key]; ks != nil {
		ks.busy--
		s.readyKeyLocked(ks, false)
		s.notify()
	}
}

// nackLocked handles a negative acknowledgement or an expired deadline: the
// message is dead-lettered when it has used up its delivery attempts,
// otherwise it becomes deliverable again, after the retry policy's backoff
// when there is one.
func (b *Broker) nackLocked(l *lease, now int64) {
	s := l.sub
	b.endLeaseLocked(l)
	if p := s.proto.DeadLetterPolicy; p != nil && l.it.attempts >= p.MaxDeliveryAttempts {
		if b.deadLetterLocked(s, l.it, now) {
			return
		}
	}
	if d := s.retryDelay(l.it.attempts); d > 0 {
		l.backoff = true
		l.at = now + int64(d)
		s.leases[l.id] = l
		b.timers.push(l)
		return
	}
	b.requeueLocked(s, l.it)
}

// retryDelay is how long a message waits after its n-th failed delivery:
// the retry policy's backoff; without one, the service's push backoff on a
// push subscription and no wait on a pull one.
func (s *subscription) retryDelay(n int32) time.Duration {
	if p := s.proto.RetryPolicy; p != nil {
		return backoff(p.MinimumBackoff.AsDuration(), p.MaximumBackoff.AsDuration(), n)
	}
	if s.push() {
		return backoff(pushMinBackoff, pushMaxBackoff, n)
	}
	return 0
}

// backoff is the delay after the n-th failed delivery: lo, doubled per
// further attempt, capped at hi.
func backoff(lo, hi time.Duration, n int32) time.Duration {
	d := lo
	for i := int32(1); i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

func (b *Broker) requeueLocked(s *subscription, it item) {
	if s.ordered() && it.m.key != "" {
		if ks := s.keys[it.m.key]; ks != nil {
			ks.busy--
		}
	}
	s.enqueueLocked(it, true)
	s.notify()
}

// deadLetterLocked republishes the message to the dead-letter topic with a
// new ID, as the service does, and finishes it on s. It reports false (the
// message is kept) when the dead-letter topic does not exist.
func (b *Broker) deadLetterLocked(s *subscription, it item, now int64) bool {
	p := s.proto.DeadLetterPolicy
	t := b.topics[p.DeadLetterTopic]
	if t == nil {
		b.log.Warn("dead-letter topic does not exist; the message stays on its subscription",
			"subscription", s.proto.Name, "dead_letter_topic", p.DeadLetterTopic, "message_id", it.m.id())
		return false
	}
	project, subID, _ := parseName(s.proto.Name, "subscriptions")
	orig := it.m.attrs()
	attrs := make(map[string]string, len(orig)+4)
	maps.Copy(attrs, orig)
	attrs[attrDLDeliveryCount] = strconv.Itoa(int(it.attempts))
	attrs[attrDLSubscription] = subID
	attrs[attrDLProject] = project
	attrs[attrDLPublishTime] = time.Unix(0, it.m.publish).UTC().Format("2006-01-02T15:04:05.000Z")
	if why := b.deliveryErrors[it.m]; why != "" {
		attrs[attrDLDeliveryError] = why // why an export could not write it
	}
	size := it.m.size
	for k, v := range attrs {
		if _, ok := orig[k]; !ok {
			size += len(k) + len(v)
		}
	}
	b.publishLocked(t, wire.Body(it.m.data(), attrs), it.m.key, size, now)
	b.finishLocked(s, it.m)
	b.releaseKeyLocked(s, it.m)
	s.deadLettered++
	return true
}

// fireTimersLocked expires every lease whose deadline has passed and ends
// every backoff that is over. It only looks at what is due.
func (b *Broker) fireTimersLocked(now int64) {
	for len(b.timers) > 0 && b.timers[0].at <= now {
		l := b.timers[0]
		if !l.backoff {
			b.nackLocked(l, now)
			continue
		}
		b.timers.remove(l)
		delete(l.sub.leases, l.id)
		l.backoff = false
		b.requeueLocked(l.sub, l.it)
	}
}

// resetSubLocked empties the subscription's queues and leases and returns the
// messages it held, in publish order.
func (b *Broker) resetSubLocked(s *subscription) []*message {
	var held []*message
	s.forEachHeld(func(m *message) { held = append(held, m) })
	slices.SortFunc(held, func(a, b *message) int { return cmpSeq(a.seq, b.seq) })
	for _, l := range s.leases {
		b.endLeaseLocked(l)
	}
	s.ready = deque[item]{}
	s.keys = map[string]*keyState{}
	s.held = 0
	if s.replay != nil {
		s.replay = &replaySet{}
	}
	return held
}

func cmpSeq(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// seekLocked makes s hold exactly the messages published at or after target:
// held ones published before are acknowledged, and messages the topic
// retained are redelivered. Messages that predate the subscription come back
// only when the topic itself retains messages, as with the service.
func (b *Broker) seekLocked(s *subscription, target int64) {
	b.logSeek(s, target)
	held := b.resetSubLocked(s)
	keep := make(map[uint64]*message, len(held))
	for _, m := range held {
		if m.publish >= target {
			keep[m.seq] = m
		}
	}
	if t := s.topic; t != nil {
		topicRetains := t.proto.MessageRetentionDuration.AsDuration() > 0
		for i := 0; i < t.retained.len(); i++ {
			m := t.retained.at(i)
			if m.publish >= target && (topicRetains || m.seq >= s.firstSeq) {
				keep[m.seq] = m
			}
		}
	}
	msgs := slices.SortedFunc(maps.Values(keep), func(a, b *message) int { return cmpSeq(a.seq, b.seq) })
	for _, m := range msgs {
		if s.filter.Match(m.body) {
			s.held++
			s.enqueueLocked(item{m: m}, false)
		}
	}
	s.notify()
}

// pruneRetainedLocked drops messages that topics kept for Seek once they are
// older than the retention window.
func (b *Broker) pruneRetainedLocked(now int64) {
	for _, t := range b.topics {
		for t.retained.len() > 0 && t.retained.front().publish < now-int64(t.retainFor) {
			t.retained.popFront()
		}
	}
}
