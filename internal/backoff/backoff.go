// Package backoff holds how dedupflow waits: a context-aware sleep, and a
// Tracker that follows one dependency (a store, a sink) and spaces out
// retries while it is down.
package backoff

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"
)

// Sleep waits for d, or until ctx is done.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Delay is the pause after the n-th failure in a row (n ≥ 1): lo doubling
// up to hi, jittered into its upper half so that replicas do not retry in
// step.
func Delay(n int, lo, hi time.Duration) time.Duration {
	d := lo << min(max(n-1, 0), 30)
	if d > hi || d <= 0 {
		d = hi
	}
	return d/2 + rand.N(d/2+1)
}

// Tracker follows one dependency. After a failure it holds new work back
// for a growing pause, so a dependency that is down sees a trickle of
// probes instead of a storm of redeliveries, and it logs one line per
// change of state, not one per message.
type Tracker struct {
	name    string
	log     *slog.Logger
	now     func() time.Time
	lo, hi  time.Duration
	downMsg string

	// failing is failures > 0, read without the lock: while the dependency
	// answers, Wait and OK cost neither the lock nor a clock reading.
	failing atomic.Bool

	mu       sync.Mutex
	failures int
	until    time.Time
	back     time.Time // when the dependency last answered after failing
}

// NewTracker follows the dependency called name; downMsg says what the
// caller does meanwhile ("nacking and backing off").
func NewTracker(name, downMsg string, log *slog.Logger, now func() time.Time) *Tracker {
	return &Tracker{name: name, downMsg: downMsg, log: log, now: now, lo: 100 * time.Millisecond, hi: 5 * time.Second}
}

// Pause is how much of the dependency's pause is left: zero while it
// answers. Work for it that arrives meanwhile is held that long (a nack
// delay) instead of being tried.
func (t *Tracker) Pause() time.Duration {
	if !t.failing.Load() {
		return 0
	}
	t.mu.Lock()
	d := t.until.Sub(t.now())
	t.mu.Unlock()
	// An injected clock may stand still; never hold longer than one
	// maximal pause of real time.
	return min(max(d, 0), t.hi)
}

// OK records a success.
func (t *Tracker) OK() {
	if !t.failing.Load() {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.failures == 0 {
		return
	}
	t.failures = 0
	t.failing.Store(false)
	t.until = time.Time{}
	t.back = t.now()
	t.log.Info(t.name+" reachable again, resuming", "component", t.name)
}

// Fail records the failure of a call made at started (zero: unknown) and
// starts (or lengthens) a pause. A call made before the dependency last
// came back reports an outage already over: its timeout, arriving just
// after the first success, must not start another.
func (t *Tracker) Fail(started time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !started.IsZero() && started.Before(t.back) {
		return
	}
	t.failures++
	t.failing.Store(true)
	if next := t.now().Add(Delay(t.failures, t.lo, t.hi)); next.After(t.until) {
		t.until = next
	}
	if t.failures == 1 {
		t.log.Warn(t.name+" unreachable: "+t.downMsg, "component", t.name, "err", err)
	}
}

// Ready reports whether the dependency answered last time.
func (t *Tracker) Ready() bool { return !t.failing.Load() }
