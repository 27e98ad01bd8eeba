package backoff

import (
	"sync"
	"time"
)

// Strikes counts how often each message came back unprocessable, so that
// one that cannot be moved aside is held back longer at each delivery and
// reported once (and at every tenfold) instead of at every delivery: a
// nacked message is redelivered at once, for as long as it stays on the
// subscription. It forgets everything when it holds maxStruck IDs;
// counting starts over, so a message is held briefly and reported again.
type Strikes struct {
	mu sync.Mutex
	n  map[string]int
}

const maxStruck = 100_000

// Add records one more delivery of id and returns how many it has had.
func (s *Strikes) Add(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == nil || len(s.n) >= maxStruck {
		s.n = make(map[string]int)
	}
	s.n[id]++
	return s.n[id]
}

// Next counts one more delivery of id, calls report with the count when it
// deserves a log line (see Report), and returns how long to hold the
// delivery before its nack: lo doubling up to hi.
func (s *Strikes) Next(id string, lo, hi time.Duration, report func(n int)) time.Duration {
	n := s.Add(id)
	if Report(n) {
		report(n)
	}
	return Delay(n, lo, hi)
}

// Report says whether the n-th strike deserves a log line: the first, the
// 10th, the 100th...
func Report(n int) bool {
	for n >= 10 && n%10 == 0 {
		n /= 10
	}
	return n == 1
}
