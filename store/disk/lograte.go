package disk

import (
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// errorEvery is how often one kind of Pebble error is logged: a failing
// disk makes Pebble retry its background work (flushes, compactions) and
// report each failure, which would otherwise flood the log.
const errorEvery = time.Minute

// errorLimit lets one line through per format and errorEvery, and counts
// the lines it held back, for the next line to say.
type errorLimit struct {
	now  func() time.Time
	mu   sync.Mutex
	seen map[string]*errorSeen
}

type errorSeen struct {
	last time.Time
	held int
}

func newErrorLimit(now func() time.Time) *errorLimit {
	return &errorLimit{now: now, seen: map[string]*errorSeen{}}
}

// allow reports whether a line of this format is due, and how many were
// held back since the last one.
func (l *errorLimit) allow(format string) (held int, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	s := l.seen[format]
	if s == nil {
		l.seen[format] = &errorSeen{last: now}
		return 0, true
	}
	if now.Sub(s.last) < errorEvery {
		s.held++
		return 0, false
	}
	held, s.held, s.last = s.held, 0, now
	return held, true
}

// pebbleLog sends Pebble's reports to the store's logger, its errors
// rate-limited.
type pebbleLog struct {
	log   *slog.Logger
	limit *errorLimit
}

func (l pebbleLog) Infof(format string, args ...any) { l.log.Debug(fmt.Sprintf(format, args...)) }

func (l pebbleLog) Errorf(format string, args ...any) {
	held, ok := l.limit.allow(format)
	if !ok {
		return
	}
	if held > 0 {
		// suppressed: lines of this kind not logged since the last.
		l.log.Error(fmt.Sprintf(format, args...), "suppressed", held)
		return
	}
	l.log.Error(fmt.Sprintf(format, args...))
}
