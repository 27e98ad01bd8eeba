package writes

import (
	"context"
	"sync"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// Defaults of a Gatherer for the table sinks.
const (
	// DefaultMax caps the items of one gathered batch; the sinks split a
	// batch further into requests within the service's limits.
	DefaultMax = 1000
	// DefaultFlushers is how many gathered batches run at once.
	DefaultFlushers = 4
	// DefaultTimeout bounds a gathered batch whose writers set no deadline
	// (or a later one): a write that outlives the default claim lease lets
	// copies of its key through anyway, so no batch is worth waiting on
	// longer.
	DefaultTimeout = dedup.DefaultLease
)

// Gathering configures a Gatherer.
type Gathering struct {
	// Max caps the items of one batch.
	Max int
	// Flushers is how many batches run at once. While they run, new
	// writes gather into the next batch, so batches grow with the load.
	Flushers int
	// Timeout bounds one batch; zero leaves it to its writers' deadlines
	// (and the flush function's own bounds).
	Timeout time.Duration
	// Closed is the error of a Write after Close.
	Closed error
}

// Flush writes items and sets errs[i] to items[i]'s outcome. ctx is the
// batch's: it ends at the latest deadline of the writers waiting on it.
type Flush[T any] func(ctx context.Context, items []T, errs []error)

// Gatherer turns single writes that arrive together (a receiver that hands
// over one message at a time makes many at once) into batches: one request
// and one commit for many writers instead of one each.
type Gatherer[T any] struct {
	opt      Gathering
	flush    Flush[T]
	base     context.Context // of every batch; cancelled by Close last
	cancel   context.CancelFunc
	reqs     chan *request[T]
	batches  chan []*request[T]
	closing  chan struct{}
	freed    chan struct{} // a flusher finished a batch
	stopOnce sync.Once
	wg       sync.WaitGroup
}

// request is one Write waiting for its batch.
type request[T any] struct {
	item T
	ctx  context.Context // the writer's: a batch skips items nobody waits for
	done chan error      // buffered: a flusher never blocks on a writer
}

// NewGatherer starts a gatherer whose batches run flush under a context
// that keeps ctx's values but not its cancellation. Max and Flushers
// below one are one.
func NewGatherer[T any](ctx context.Context, o Gathering, flush Flush[T]) *Gatherer[T] {
	o.Max, o.Flushers = max(o.Max, 1), max(o.Flushers, 1)
	g := &Gatherer[T]{
		opt:     o,
		flush:   flush,
		reqs:    make(chan *request[T]),
		batches: make(chan []*request[T]),
		closing: make(chan struct{}),
		// One token per finished batch. Room for one more than the
		// flushers: after the gatherer stops reading, the last batch's
		// token must not block its flusher.
		freed: make(chan struct{}, o.Flushers+1),
	}
	// Batches run on a context of the gatherer's, not of any one writer:
	// a batch serves many writers, and one giving up must not fail the rest.
	g.base, g.cancel = context.WithCancel(context.WithoutCancel(ctx))
	g.wg.Add(1 + o.Flushers)
	go g.gather()
	for range o.Flushers {
		go g.run()
	}
	return g
}

// Write hands item to the next batch and returns its outcome once the
// batch answered. When ctx ends first it returns context.Cause(ctx) itself,
// for the caller to wrap with what it knows; the batch may still write the
// item. After Close it returns the Closed error.
func (g *Gatherer[T]) Write(ctx context.Context, item T) error {
	req := &request[T]{item: item, ctx: ctx, done: make(chan error, 1)}
	select {
	case g.reqs <- req:
	case <-g.closing:
		return g.opt.Closed
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case err := <-req.done:
		return err
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// Close stops taking writes, finishes the batches under way and waits for
// the gatherer's goroutines.
func (g *Gatherer[T]) Close() {
	g.stopOnce.Do(func() {
		close(g.closing)
		g.wg.Wait()
		g.cancel()
	})
}

// gather collects requests and hands them to idle flushers. A lone write
// goes at once: with nothing in flight there is nothing to wait for. While
// batches run, writes gather (group commit), and another batch is started
// only once it is big enough to pay for it: busy/Flushers of Max. Every
// batch commits, and a commit costs about as much as hundreds of rows, so
// many small parallel batches measured slower than one big one; this rule
// gives small loads one batch at a time and lets heavy loads use every
// flusher with large batches.
func (g *Gatherer[T]) gather() {
	defer g.wg.Done()
	defer close(g.batches)
	maxN, flushers := g.opt.Max, g.opt.Flushers
	pending := make([]*request[T], 0, maxN)
	busy := 0
	for {
		in := g.reqs
		if len(pending) >= maxN {
			in = nil // full: wait for a flusher
		}
		var out chan []*request[T]
		if len(pending) > 0 && busy < flushers && len(pending) >= busy*maxN/flushers {
			out = g.batches
		}
		select {
		case r := <-in:
			pending = append(pending, r)
			// Take what is already waiting before offering the batch, so
			// an idle flusher does not get a batch of one while writers
			// queue behind it.
		drain:
			for len(pending) < maxN {
				select {
				case r := <-g.reqs:
					pending = append(pending, r)
				default:
					break drain
				}
			}
		case out <- pending:
			busy++
			pending = make([]*request[T], 0, maxN)
		case <-g.freed:
			busy--
		case <-g.closing:
			// reqs is unbuffered, so nothing more can arrive: Writes
			// still blocked on it see closing and return the Closed error.
			if len(pending) > 0 {
				g.batches <- pending
			}
			return
		}
	}
}

func (g *Gatherer[T]) run() {
	defer g.wg.Done()
	for b := range g.batches {
		g.write(b)
		g.freed <- struct{}{}
	}
}

// write flushes one batch and answers every writer in it.
func (g *Gatherer[T]) write(reqs []*request[T]) {
	// A writer whose context ended has already returned an error, and its
	// message will come back: no need to write its item now.
	live := reqs[:0]
	for _, r := range reqs {
		if r.ctx.Err() == nil {
			live = append(live, r)
		}
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := g.context(live)
	defer cancel()
	items := make([]T, len(live))
	for i, r := range live {
		items[i] = r.item
	}
	errs := make([]error, len(live))
	g.flush(ctx, items, errs)
	for i, r := range live {
		r.done <- errs[i]
	}
}

// context is a batch's: it ends at the latest deadline of its writers,
// since none waits longer, and within Timeout. A writer without a deadline
// waits as long as it takes, so then only Timeout bounds the batch.
func (g *Gatherer[T]) context(live []*request[T]) (context.Context, context.CancelFunc) {
	var end time.Time
	for _, r := range live {
		d, ok := r.ctx.Deadline()
		if !ok {
			end = time.Time{}
			break
		}
		if d.After(end) {
			end = d
		}
	}
	if g.opt.Timeout > 0 {
		if by := time.Now().Add(g.opt.Timeout); end.IsZero() || by.Before(end) {
			end = by
		}
	}
	if end.IsZero() {
		return context.WithCancel(g.base)
	}
	return context.WithDeadline(g.base, end)
}
