package gate

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// deadlines hands out contexts that end between d-grain and d from now
// (never later: a write must end before its claim's lease), one shared by
// every caller within a grain, because a context with a timeout per write
// and per commit costs a timer and three allocations per message. The
// contexts carry no values and are not canceled by a shutdown, which is
// what writes that must outlive one want.
type deadlines struct {
	d, grain time.Duration
	cur      atomic.Pointer[deadlineCtx]
	mu       sync.Mutex // serializes making the next context
}

type deadlineCtx struct {
	ctx   context.Context
	until time.Time
	// cancel is not called: callers may still hold ctx when the next one
	// is made, and the deadline's timer frees what it holds.
	cancel context.CancelFunc
}

func newDeadlines(d time.Duration) *deadlines {
	return &deadlines{d: d, grain: min(d/10, 100*time.Millisecond)}
}

// ctx returns a context whose deadline is at most d and at least d-grain
// from now.
func (s *deadlines) ctx() context.Context {
	// time.Until reads only the monotonic clock, not the wall clock too
	// as time.Now does, and this runs for every message.
	if c := s.cur.Load(); c != nil && time.Until(c.until) >= s.d-s.grain {
		return c.ctx
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c := s.cur.Load(); c != nil && time.Until(c.until) >= s.d-s.grain {
		return c.ctx
	}
	until := time.Now().Add(s.d)
	ctx, cancel := context.WithDeadline(context.Background(), until)
	s.cur.Store(&deadlineCtx{ctx: ctx, until: until, cancel: cancel})
	return ctx
}
