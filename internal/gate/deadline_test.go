package gate

import (
	"testing"
	"time"
)

// Writes share deadline contexts, but none gets more than the write
// timeout (a write must end before its claim's lease) nor much less.
func TestDeadlinesBounds(t *testing.T) {
	const d = 200 * time.Millisecond
	s := newDeadlines(d)
	first := s.ctx()
	if s.ctx() != first {
		t.Error("two writes in a row got contexts of their own, not a shared one")
	}
	for end := time.Now().Add(3 * d); time.Now().Before(end); time.Sleep(3 * time.Millisecond) {
		before := time.Now()
		dl, ok := s.ctx().Deadline()
		after := time.Now()
		if !ok || dl.Sub(after) > d || dl.Sub(before) < d-s.grain {
			t.Fatalf("deadline %v from the call, want between %v and %v", dl.Sub(before), d-s.grain, d)
		}
	}
	if first.Err() == nil {
		t.Error("the first context did not end at its deadline")
	}
}
