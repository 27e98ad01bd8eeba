package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"

	"cloud.google.com/go/pubsub/v2"
)

// Attributes every benchmark message carries.
const (
	attrKey       = "key"       // the publisher's stable key: the dedup key
	attrSeq       = "seq"       // the logical event's number
	attrCopy      = "copy"      // 0 on the first message, 1 on a republished copy
	attrRedeliver = "redeliver" // "1": the injector turns this message's first ack into a nack
	attrTime      = "ts"        // the event time, when the workload has one (workload.stamp)
)

// workload is one benchmark input: events logical events, a dupRatio share
// of which is published a second time as a new message with the same key
// (a publisher retrying after a lost response), and a redeliverRatio share
// whose first messages are delivered twice with the same message ID (an
// ack lost on the way back; see injector). A copy follows its original
// after a random number (1 to spread) of further originals, as a retry
// does a little later, so copies are sometimes in flight together with
// their originals.
type workload struct {
	events         int
	dupRatio       float64
	redeliverRatio float64
	payload        int
	spread         int
	seed           uint64
	keyPrefix      string // unique per run, so a shared Redis never sees a key twice
	// stamp, if set, is every message's event time in attrTime (ms since
	// the epoch); every unusableEvery-th event carries one that is not a
	// time instead, which no pipeline told to read it can judge.
	stamp         int64
	unusableEvery int
}

// unusable says whether event e carries a malformed event time.
func (w workload) unusable(e int) bool {
	return w.unusableEvery > 0 && e%w.unusableEvery == w.unusableEvery-1
}

// good is the number of events a correct pipeline emits.
func (w workload) good() int {
	if w.unusableEvery <= 0 {
		return w.events
	}
	return w.events - w.events/w.unusableEvery
}

// unusableIn counts the messages of a plan that carry a malformed event time.
func (w workload) unusableIn(msgs []wmsg) int {
	n := 0
	for _, m := range msgs {
		if w.unusable(m.event) {
			n++
		}
	}
	return n
}

// wmsg is one message of a workload.
type wmsg struct {
	event     int
	copy      int
	redeliver bool
}

// plan lays the workload's messages out in publish order. Which events are
// copied or redelivered is an exact share (ratio × events), chosen with the
// seeded generator, so every contender gets the same input.
func (w workload) plan() []wmsg {
	rng := rand.New(rand.NewPCG(w.seed, 0x5eed))
	dups := choose(rng, w.events, int(w.dupRatio*float64(w.events)+0.5))
	redel := choose(rng, w.events, int(w.redeliverRatio*float64(w.events)+0.5))
	spread := max(1, w.spread)
	// later[i] holds the copies due after the i-th original.
	later := make(map[int][]int, len(dups))
	for e := 0; e < w.events; e++ { // in order: the draws must not depend on map order
		if dups[e] {
			due := e + 1 + rng.IntN(spread)
			later[due] = append(later[due], e)
		}
	}
	out := make([]wmsg, 0, w.events+len(dups))
	for e := 0; e < w.events; e++ {
		for _, c := range later[e] {
			out = append(out, wmsg{event: c, copy: 1})
		}
		out = append(out, wmsg{event: e, redeliver: redel[e]})
	}
	// Copies due past the last original go at the end.
	for due := w.events; due <= w.events+spread; due++ {
		for _, c := range later[due] {
			out = append(out, wmsg{event: c, copy: 1})
		}
	}
	return out
}

// choose picks exactly k of n indexes (Floyd's algorithm).
func choose(rng *rand.Rand, n, k int) map[int]bool {
	s := make(map[int]bool, k)
	for j := n - k; j < n; j++ {
		t := rng.IntN(j + 1)
		if s[t] {
			s[j] = true
		} else {
			s[t] = true
		}
	}
	return s
}

// key is event e's dedup key.
func (w workload) key(e int) string { return w.keyPrefix + "-" + strconv.Itoa(e) }

// data is a message's payload: small, readable, naming its event.
func (w workload) data(m wmsg) []byte {
	b := make([]byte, w.payload)
	n := copy(b, "event "+strconv.Itoa(m.event)+" ")
	for i := n; i < len(b); i++ {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

func (w workload) attrs(m wmsg) map[string]string {
	a := map[string]string{attrKey: w.key(m.event), attrSeq: strconv.Itoa(m.event), attrCopy: strconv.Itoa(m.copy)}
	if m.redeliver {
		a[attrRedeliver] = "1"
	}
	switch {
	case w.unusable(m.event):
		a[attrTime] = "not-a-time"
	case w.stamp != 0:
		a[attrTime] = strconv.FormatInt(w.stamp, 10)
	}
	return a
}

// publish puts the whole workload on topic before a contender starts, so
// that what is timed is the contender draining a backlog, not the
// publisher. Settings as broker/bench_test.go: large batches, many in
// flight.
func (w workload) publish(ctx context.Context, c *pubsub.Client, topic string, msgs []wmsg) error {
	p := c.Publisher(topic)
	defer p.Stop()
	p.PublishSettings.NumGoroutines = 16
	p.PublishSettings.CountThreshold = 1000
	p.PublishSettings.ByteThreshold = 5e6
	p.PublishSettings.FlowControlSettings.MaxOutstandingMessages = 50_000
	results := make([]*pubsub.PublishResult, 0, len(msgs))
	for _, m := range msgs {
		results = append(results, p.Publish(ctx, &pubsub.Message{Data: w.data(m), Attributes: w.attrs(m)}))
	}
	for i, r := range results {
		if _, err := r.Get(ctx); err != nil {
			return fmt.Errorf("publish message %d of the workload: %w", i, err)
		}
	}
	return nil
}

// counts summarises a plan.
func counts(msgs []wmsg) (total, copies, redeliver int) {
	for _, m := range msgs {
		total++
		if m.copy > 0 {
			copies++
		}
		if m.redeliver {
			redeliver++
		}
	}
	return total, copies, redeliver
}
