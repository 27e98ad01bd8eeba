package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/postgres"
)

// TestWriteBatch: a batch is one statement per MaxBatch rows, copies of a
// key in it folded as two writes in order would leave them; a message that
// cannot be stored fails alone, as permanent; after Close every message of
// a batch fails with ErrClosed.
func TestWriteBatch(t *testing.T) {
	for _, c := range []struct {
		on   postgres.OnConflict
		want string // the data of key-0's row
	}{{postgres.DoNothing, "first"}, {postgres.DoUpdate, "last"}} {
		t.Run(c.on.String(), func(t *testing.T) {
			e := newEnv(t)
			s := e.open(t, postgres.Options{OnConflict: c.on})
			const n = 1200
			ms := make([]*sink.Message, n)
			for i := range ms {
				ms[i] = msg(fmt.Sprintf("key-%d", i), fmt.Sprintf("m-%d", i), "x")
			}
			ms[7].Key = "bad\x00key"
			errs := make([]error, n)
			s.WriteBatch(context.Background(), ms, errs)
			for i, err := range errs {
				if i == 7 && !errors.Is(err, sink.ErrPermanent) {
					t.Errorf("the unstorable message: %v, want ErrPermanent", err)
				}
				if i != 7 && err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
			}
			if st := s.Stats(); st.Batches != 3 {
				t.Errorf("a batch of %d rows took %d statements, want 3 (MaxBatch 500)", n-1, st.Batches)
			}
			if got := e.count(t, ""); got != n-1 {
				t.Errorf("table has %d rows, want %d", got, n-1)
			}
			// Copies of one key in one statement: DO UPDATE would fail on
			// them unfolded.
			hot := []*sink.Message{msg("hot", "h1", "first"), msg("hot", "h2", "mid"), msg("hot", "h3", "last")}
			errs = make([]error, len(hot))
			s.WriteBatch(context.Background(), hot, errs)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if got := e.count(t, "key = 'hot' AND data = $1", c.want); got != 1 {
				t.Errorf("the row of three copies in one batch is not the %s write's", c.want)
			}
			s.Close()
			errs = make([]error, 2)
			s.WriteBatch(context.Background(), ms[:2], errs)
			for i, err := range errs {
				if !errors.Is(err, postgres.ErrClosed) {
					t.Errorf("message %d after Close: %v, want ErrClosed", i, err)
				}
			}
		})
	}
}
