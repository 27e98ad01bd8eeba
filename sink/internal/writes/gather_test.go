package writes

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

// flusher is a test's flush function: it reports each batch, with its
// context, and holds it until the test lets it go.
type flusher struct {
	got  chan batch
	gate chan struct{} // one receive per batch; closed: batches run freely
}

type batch struct {
	items []int
	ctx   context.Context
}

func newFlusher() *flusher {
	return &flusher{got: make(chan batch, 16), gate: make(chan struct{})}
}

// flush fails odd items with their own error, so each writer can tell its
// outcome from another's.
func (f *flusher) flush(ctx context.Context, items []int, errs []error) {
	f.got <- batch{append([]int(nil), items...), ctx}
	<-f.gate
	for i, it := range items {
		if it%2 == 1 {
			errs[i] = fmt.Errorf("item %d", it)
		}
	}
}

func gatherer(t *testing.T, o Gathering, f *flusher) *Gatherer[int] {
	t.Helper()
	o.Closed = errClosed
	g := NewGatherer(context.Background(), o, f.flush)
	t.Cleanup(func() {
		close(f.gate)
		g.Close()
	})
	return g
}

// watched tells when Write took its item: Write watches ctx.Done once
// while handing the item over and again while it waits for its batch.
type watched struct {
	context.Context
	n     atomic.Int32
	taken chan struct{}
}

func watch(ctx context.Context) *watched {
	return &watched{Context: ctx, taken: make(chan struct{})}
}

func (w *watched) Done() <-chan struct{} {
	if w.n.Add(1) == 2 {
		close(w.taken)
	}
	return w.Context.Done()
}

// write runs Write in the background and returns its outcome's channel
// once the gatherer holds the item.
func write(g *Gatherer[int], ctx context.Context, item int) <-chan error {
	w := watch(ctx)
	out := make(chan error, 1)
	go func() { out <- g.Write(w, item) }()
	<-w.taken
	return out
}

// TestGatherLoneWrite: with nothing in flight a write is flushed at once,
// alone, and gets its own outcome.
func TestGatherLoneWrite(t *testing.T) {
	f := newFlusher()
	g := gatherer(t, Gathering{Max: 10, Flushers: 2}, f)
	done := write(g, context.Background(), 3)
	if b := <-f.got; !reflect.DeepEqual(b.items, []int{3}) {
		t.Fatalf("flushed %v, want [3]", b.items)
	}
	f.gate <- struct{}{}
	if err := <-done; err == nil || err.Error() != "item 3" {
		t.Errorf("Write = %v, want its item's error", err)
	}
}

// TestGatherWhileFlushing: writes that arrive while a batch runs go
// together in the next one, and each writer gets its own item's outcome.
func TestGatherWhileFlushing(t *testing.T) {
	f := newFlusher()
	g := gatherer(t, Gathering{Max: 10, Flushers: 1}, f)
	first := write(g, context.Background(), 0)
	<-f.got
	var rest []<-chan error
	for i := 1; i <= 4; i++ {
		rest = append(rest, write(g, context.Background(), i))
	}
	f.gate <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if b := <-f.got; !reflect.DeepEqual(b.items, []int{1, 2, 3, 4}) {
		t.Fatalf("second batch %v, want [1 2 3 4]", b.items)
	}
	f.gate <- struct{}{}
	for i, done := range rest {
		item, err := i+1, <-done
		if odd := item%2 == 1; (err != nil) != odd || odd && err.Error() != fmt.Sprint("item ", item) {
			t.Errorf("write of item %d = %v, want its own outcome", item, err)
		}
	}
}

// TestGatherSkipsGaveUp: a writer whose context ends while it waits gets
// its context's cause, and its item is not flushed.
func TestGatherSkipsGaveUp(t *testing.T) {
	f := newFlusher()
	g := gatherer(t, Gathering{Max: 10, Flushers: 1}, f)
	first := write(g, context.Background(), 0)
	<-f.got
	gaveUp := errors.New("gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	quitter := write(g, ctx, 2)
	stayer := write(g, context.Background(), 4)
	cancel(gaveUp)
	if err := <-quitter; err != gaveUp {
		t.Errorf("the writer that gave up got %v, want its context's cause", err)
	}
	f.gate <- struct{}{}
	<-first
	if b := <-f.got; !reflect.DeepEqual(b.items, []int{4}) {
		t.Errorf("next batch %v, want [4] without the item nobody waits for", b.items)
	}
	f.gate <- struct{}{}
	if err := <-stayer; err != nil {
		t.Error(err)
	}
}

// TestGatherBatchContext: a batch outlives any one of its writers giving
// up, and ends at the latest of their deadlines; a writer without one
// leaves only Timeout to bound it.
func TestGatherBatchContext(t *testing.T) {
	f := newFlusher()
	g := gatherer(t, Gathering{Max: 10, Flushers: 1, Timeout: time.Hour}, f)
	first := write(g, context.Background(), 0)
	b := <-f.got
	if d, ok := b.ctx.Deadline(); !ok || time.Until(d) > time.Hour {
		t.Errorf("a batch of a writer without a deadline ends at %v, want within Timeout", d)
	}
	soon, late := time.Now().Add(10*time.Minute), time.Now().Add(20*time.Minute)
	soonCtx, cancelSoon := context.WithDeadline(context.Background(), soon)
	defer cancelSoon()
	lateCtx, cancelLate := context.WithDeadline(context.Background(), late)
	defer cancelLate()
	quitter := write(g, soonCtx, 2)
	stayer := write(g, lateCtx, 4)
	f.gate <- struct{}{}
	<-first
	b = <-f.got
	if d, _ := b.ctx.Deadline(); !d.Equal(late) {
		t.Errorf("batch ends at %v, want the latest writer deadline %v", d, late)
	}
	cancelSoon()
	<-quitter
	if err := b.ctx.Err(); err != nil {
		t.Errorf("one writer gave up and the batch's context ended: %v", err)
	}
	f.gate <- struct{}{}
	if err := <-stayer; err != nil {
		t.Error(err)
	}
}

// TestGatherClose: Close flushes what was gathered, waits for it, and
// then refuses writes.
func TestGatherClose(t *testing.T) {
	f := newFlusher()
	g := NewGatherer(context.Background(), Gathering{Max: 10, Flushers: 1, Closed: errClosed}, f.flush)
	first := write(g, context.Background(), 0)
	<-f.got
	gathered := write(g, context.Background(), 2)
	closed := make(chan struct{})
	go func() {
		g.Close()
		close(closed)
	}()
	<-g.closing
	f.gate <- struct{}{}
	if b := <-f.got; !reflect.DeepEqual(b.items, []int{2}) {
		t.Errorf("after Close the gathered batch is %v, want [2]", b.items)
	}
	select {
	case <-closed:
		t.Fatal("Close returned before the gathered batch was written")
	default:
	}
	f.gate <- struct{}{}
	<-closed
	if err := errors.Join(<-first, <-gathered); err != nil {
		t.Errorf("writes taken before Close: %v", err)
	}
	if err := g.Write(context.Background(), 6); err != errClosed {
		t.Errorf("Write after Close = %v, want the closed error", err)
	}
}
