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

// both is a sink with WriteBatch too, counting each kind of call.
type both struct {
	single
	batches int
}

func (b *both) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	b.batches++
	for i, m := range ms {
		errs[i] = b.single.Write(ctx, m)
	}
}

// TestWriteBatchOfOneIsWrite: a batch of one message goes through Write,
// where a sink gathers concurrent writes into one request (the topic
// sink's Publish); larger batches go through WriteBatch.
func TestWriteBatchOfOneIsWrite(t *testing.T) {
	b := &both{}
	errs := make([]error, 2)
	sink.WriteBatch(context.Background(), b, []*sink.Message{{ID: "a"}}, errs[:1])
	if b.batches != 0 || len(b.written) != 1 {
		t.Fatalf("a batch of one: %d WriteBatch calls, written %v; want one Write", b.batches, b.written)
	}
	sink.WriteBatch(context.Background(), b, []*sink.Message{{ID: "b"}, {ID: "c"}}, errs)
	if b.batches != 1 || len(b.written) != 3 {
		t.Fatalf("a batch of two: %d WriteBatch calls, written %v; want one WriteBatch", b.batches, b.written)
	}
}
