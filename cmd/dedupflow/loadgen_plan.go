package main

import (
	"fmt"
	"math"
	"math/rand/v2"
)

// loadPlanConfig says what a run publishes.
type loadPlanConfig struct {
	count          int
	dupRatio       float64 // of keyed events
	dupCopies      int
	redeliverRatio float64 // of all events
	missingRatio   float64 // of all events
	seed           uint64
}

// plannedEvent is one logical event of a plan.
type plannedEvent struct {
	seq       int
	copies    int  // extra messages with the same key
	keyless   bool // published without the id attribute
	redeliver bool // first message marked with attrRedeliver
}

// planTotals are a plan's exact counts, known before anything is sent.
type planTotals struct {
	Events, Keyless, Republished, Copies, Redeliver, Messages int
}

// loadPlan yields the events of a run one at a time, so its memory does
// not grow with --count. Each share is an exact count (ratio × events,
// rounded), spread over the run by selection sampling with its own
// seeded stream: the same seed and flags give the same plan.
type loadPlan struct {
	cfg                     loadPlanConfig
	totals                  planTotals
	seq                     int
	keyless, dup, redeliver sampler
}

func newLoadPlan(c loadPlanConfig) (*loadPlan, error) {
	if c.count < 1 {
		return nil, fmt.Errorf("--count %d must be at least 1", c.count)
	}
	for _, r := range []struct {
		flag string
		v    float64
	}{{"--dup-ratio", c.dupRatio}, {"--redeliver-ratio", c.redeliverRatio}, {"--missing-id-ratio", c.missingRatio}} {
		if !(r.v >= 0 && r.v <= 1) { // also rejects NaN
			return nil, fmt.Errorf("%s %v must be between 0 and 1", r.flag, r.v)
		}
	}
	if c.dupCopies < 1 {
		return nil, fmt.Errorf("--dup-copies %d must be at least 1", c.dupCopies)
	}
	share := func(r float64, of int) int { return int(math.Round(r * float64(of))) }
	t := planTotals{Events: c.count, Keyless: share(c.missingRatio, c.count), Redeliver: share(c.redeliverRatio, c.count)}
	// Only keyed events are republished: without a key, a second copy
	// would be a new event to any pipeline, not a duplicate.
	keyed := c.count - t.Keyless
	t.Republished = share(c.dupRatio, keyed)
	t.Copies = t.Republished * c.dupCopies
	t.Messages = t.Events + t.Copies
	return &loadPlan{cfg: c, totals: t,
		keyless:   newSampler(c.seed, 1, t.Keyless, c.count),
		dup:       newSampler(c.seed, 2, t.Republished, keyed),
		redeliver: newSampler(c.seed, 3, t.Redeliver, c.count),
	}, nil
}

// next returns the next event, or false after the last.
func (p *loadPlan) next() (plannedEvent, bool) {
	if p.seq >= p.cfg.count {
		return plannedEvent{}, false
	}
	e := plannedEvent{seq: p.seq, keyless: p.keyless.next(), redeliver: p.redeliver.next()}
	if !e.keyless && p.dup.next() {
		e.copies = p.cfg.dupCopies
	}
	p.seq++
	return e, true
}

// sampler picks exactly want of n items, in order, each subset equally
// likely (Knuth's selection sampling, Algorithm S).
type sampler struct {
	rng        *rand.Rand
	want, left int
}

func newSampler(seed, stream uint64, want, n int) sampler {
	return sampler{rng: rand.New(rand.NewPCG(seed, stream)), want: want, left: n}
}

func (s *sampler) next() bool {
	if s.left <= 0 {
		return false
	}
	pick := s.rng.IntN(s.left) < s.want
	s.left--
	if pick {
		s.want--
	}
	return pick
}
