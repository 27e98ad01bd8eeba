package sink_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/dedupflow/dedupflow/sink"
)

// single is a sink without WriteBatch that fails the messages named "bad".
type single struct {
	mu      sync.Mutex
	written []string
}

func (s *single) Write(_ context.Context, m *sink.Message) error {
	if m.ID == "bad" {
		return sink.ErrPermanent
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.written = append(s.written, m.ID)
	return nil
}

// TestWriteBatchFallback: a sink with only Write gets one Write per message
// of a batch, and each message its own result.
func TestWriteBatchFallback(t *testing.T) {
	s := &single{}
	ms := []*sink.Message{{ID: "a"}, {ID: "bad"}, {ID: "c"}}
	errs := make([]error, len(ms))
	sink.WriteBatch(context.Background(), s, ms, errs)
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], sink.ErrPermanent) {
		t.Fatalf("errors %v: want only the bad message's", errs)
	}
	if len(s.written) != 2 {
		t.Fatalf("written %v, want a and c", s.written)
	}
}
