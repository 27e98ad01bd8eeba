package broker

import "slices"

// replaySet is what a subscription holds while the log is replayed. Most
// records are publishes and checkpointed messages, in publish order, so it
// appends them to a slice; acks (and seeks, which add a message back) only
// mark sequence numbers. A map of every held message cost most of the
// replay's CPU in its hashing.
type replaySet struct {
	added  []*message
	acked  map[uint64]struct{}
	sorted bool // added is in strictly increasing seq order
}

func (r *replaySet) add(m *message) {
	if len(r.added) == 0 {
		r.sorted = true
	} else if r.sorted && r.added[len(r.added)-1].seq >= m.seq {
		r.sorted = false
	}
	r.added = append(r.added, m)
	delete(r.acked, m.seq)
}

func (r *replaySet) ack(seq uint64) {
	if r.acked == nil {
		r.acked = map[uint64]struct{}{}
	}
	r.acked[seq] = struct{}{}
}

// held returns the messages added and not acknowledged since, each once, in
// publish order.
func (r *replaySet) held() []*message {
	out := r.added
	if len(r.acked) > 0 {
		out = make([]*message, 0, len(r.added))
		for _, m := range r.added {
			if _, gone := r.acked[m.seq]; !gone {
				out = append(out, m)
			}
		}
	}
	if !r.sorted {
		out = slices.Clone(out)
		slices.SortFunc(out, func(a, b *message) int { return cmpSeq(a.seq, b.seq) })
		out = slices.CompactFunc(out, func(a, b *message) bool { return a.seq == b.seq })
	}
	return out
}
