package consumer

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"
)

// health follows the store, as the pipeline's does (pipeline/backoff.go;
// unexported there, so repeated here rather than widening its API). After
// a failure it holds new work back for an exponentially growing pause, so
// a store that is down sees a trickle of probes instead of a storm of
// redeliveries, and it logs one line per change of state, not one per
// message.
type health struct {
	name string
	log  *slog.Logger
	now  func() time.Time
	min  time.Duration
	max  time.Duration

	mu       sync.Mutex
	failures int
	until    time.Time
	down     bool
}

func newHealth(name string, log *slog.Logger, now func() time.Time) *health {
	return &health{name: name, log: log, now: now, min: 100 * time.Millisecond, max: 5 * time.Second}
}

// wait blocks while the store is in a pause.
func (h *health) wait(ctx context.Context) error {
	h.mu.Lock()
	d := h.until.Sub(h.now())
	h.mu.Unlock()
	if d <= 0 {
		return nil
	}
	// An injected clock may stand still; never hold longer than one
	// maximal pause of real time.
	t := time.NewTimer(min(d, h.max))
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

func (h *health) ok() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failures == 0 {
		return
	}
	h.failures = 0
	h.until = time.Time{}
	if h.down {
		h.down = false
		h.log.Info(h.name+" reachable again, resuming", "component", h.name)
	}
}

func (h *health) fail(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failures++
	d := h.min << min(h.failures-1, 16)
	if d > h.max || d <= 0 {
		d = h.max
	}
	d = d/2 + rand.N(d/2+1) // jitter, so replicas do not probe in step
	if next := h.now().Add(d); next.After(h.until) {
		h.until = next
	}
	if !h.down {
		h.down = true
		h.log.Warn(h.name+" unreachable: holding messages, nacking and backing off", "component", h.name, "err", err)
	}
}

func (h *health) ready() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.down
}
