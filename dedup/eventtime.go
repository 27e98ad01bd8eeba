package dedup

import (
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"
)

// TimeDomain is the clock the horizon is measured on.
type TimeDomain uint8

const (
	// ProcessingTime: a key expires a horizon after this process first saw
	// it (the default, as Beam's Deduplicate).
	ProcessingTime TimeDomain = iota
	// EventTime: a key expires when the watermark passes its event time
	// plus the horizon. A claim's event time first advances the watermark;
	// a message whose key would already have expired (event time + horizon
	// not after the watermark) gets ErrTooLate and no claim; otherwise the
	// store judges at the watermark (Claim.Now) and the key, once
	// committed, expires at event time + horizon.
	//
	// The lease is an offset from the watermark (Claim.LeaseUntil =
	// watermark + lease), because the Store compares LeaseUntil with
	// Claim.Now and both must be on one clock. In this process that costs
	// nothing: copies of a key being written here wait on the Deduper's own
	// table, whatever the times. Across processes it means: after a restart
	// no lease survives (memory and disk stores keep leases in memory only);
	// Redis drops a pending record PX = LeaseUntil - Now = lease after it
	// was written, in wall time, so a dead replica's claim is freed after
	// the lease on the wall clock; but a replica whose own watermark is more
	// than the lease ahead of the claimant's can take a live claim over, and
	// both may write — one extra output, carrying the key, as after a crash
	// between write and commit.
	EventTime
)

// ParseTimeDomain reads a --time-domain value.
func ParseTimeDomain(s string) (TimeDomain, error) {
	switch s {
	case "processing", "":
		return ProcessingTime, nil
	case "event":
		return EventTime, nil
	}
	return 0, fmt.Errorf("unknown time domain %q: want processing or event", s)
}

func (d TimeDomain) String() string {
	if d == EventTime {
		return "event"
	}
	return "processing"
}

// Late is what happens to a message too late to judge in event time: its
// event time is so far behind the watermark that its key would already
// have expired, so the store can no longer tell whether a copy was emitted.
type Late uint8

const (
	// LatePass emits it without dedup (counted): losing nothing comes
	// before dropping duplicates.
	LatePass Late = iota
	// LateDeadLetter sends it to the dead-letter topic with the reason.
	LateDeadLetter
)

// ParseLate reads a --late value.
func ParseLate(s string) (Late, error) {
	switch s {
	case "pass", "":
		return LatePass, nil
	case "dead-letter":
		return LateDeadLetter, nil
	}
	return 0, fmt.Errorf("unknown late policy %q: want pass or dead-letter", s)
}

func (l Late) String() string {
	if l == LateDeadLetter {
		return "dead-letter"
	}
	return "pass"
}

// ErrTooLate is returned by Claim, in event time, for a message whose event time plus
// the horizon is not after the watermark.
var ErrTooLate = errors.New("event too late to judge")

// watermark is a per-process heuristic watermark: the highest event time
// seen, held back to the processing clock (so one producer with a clock
// set in the future cannot expire every key), minus the allowed lateness.
//
// Dataflow's watermark is an estimate of the oldest event time still
// unprocessed anywhere in the job, computed by the service from the
// subscription's backlog, and global across workers. This one is cheaper
// and local, with three consequences: each replica has its own (replicas
// sharing a Redis store judge with slightly different clocks); a stalled
// stream holds it, so keys do not expire while nothing arrives; and events
// more than the lateness out of order are judged against a watermark that
// has already moved past them.
type watermark struct {
	lateness time.Duration
	now      func() time.Time
	max      atomic.Int64 // Unix ns of the highest (clamped) event time; MinInt64 until one is seen
}

func newWatermark(lateness time.Duration, now func() time.Time) *watermark {
	w := &watermark{lateness: lateness, now: now}
	w.max.Store(math.MinInt64)
	return w
}

// earliest is the earliest time Unix nanoseconds can hold (the year 1677);
// event times before it (timestamps accept year 1) cannot advance the
// watermark, and are judged too late once there is one.
var earliest = time.Unix(0, math.MinInt64)

// observe folds in one event time and returns the watermark after it.
func (w *watermark) observe(et time.Time) time.Time {
	if et.Before(earliest) {
		wm, _ := w.get()
		return wm
	}
	// Compared as times: et may be past 2262, where UnixNano overflows.
	now := w.now()
	t := now.UnixNano()
	if et.Before(now) {
		t = et.UnixNano()
	}
	for cur := w.max.Load(); t > cur; cur = w.max.Load() {
		if w.max.CompareAndSwap(cur, t) {
			break
		}
	}
	return time.Unix(0, w.max.Load()).Add(-w.lateness)
}

// get returns the watermark, and false before any event was seen (the
// watermark is then the earliest time, which judges everything).
func (w *watermark) get() (time.Time, bool) {
	m := w.max.Load()
	if m == math.MinInt64 {
		return earliest, false
	}
	return time.Unix(0, m).Add(-w.lateness), true
}

// Domain is the time domain in force.
func (d *Deduper) Domain() TimeDomain { return d.opt.TimeDomain }

// Watermark is the event-time watermark, and false in processing time or
// before the first event.
func (d *Deduper) Watermark() (time.Time, bool) {
	if d.wm == nil {
		return time.Time{}, false
	}
	return d.wm.get()
}

// judge is when the key of an event at et, once committed, expires, or
// ErrTooLate if that is not after the watermark wm.
func (d *Deduper) judge(et, wm time.Time) (time.Time, error) {
	// A future-dated event (a producer's clock, or seconds sent as
	// milliseconds) is held to the processing clock, as the watermark is:
	// otherwise its key would outlive the horizon by years and push the
	// stores' time ranges far ahead.
	expires := minTime(et, d.opt.Now()).Add(d.opt.Horizon)
	if !expires.After(wm) {
		return time.Time{}, fmt.Errorf("%w: event time %s is more than the horizon %v behind the watermark %s",
			ErrTooLate, et.UTC().Format(time.RFC3339Nano), d.opt.Horizon, wm.UTC().Format(time.RFC3339Nano))
	}
	return expires, nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
