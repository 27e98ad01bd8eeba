// Package writes holds the frame of a batch write that the sinks share:
// single writes gathered into batches, writes refused once the sink is
// closed, and a batch cut into the fewest requests the service's limits
// allow.
package writes

import (
	"sync"

	"github.com/dedupflow/dedupflow/sink"
)

// Guard lets writes run until Close, which waits for those under way.
// The zero value is open.
type Guard struct {
	mu     sync.RWMutex // held to read by writes, to write by Close
	closed bool
}

// Do runs write, or, once Close has run, sets every errs[i] to closed.
func (g *Guard) Do(errs []error, closed error, write func()) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		for i := range errs {
			errs[i] = closed
		}
		return
	}
	write()
}

// Close waits for the writes under way and runs release, the first time
// only.
func (g *Guard) Close(release func()) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.closed {
		g.closed = true
		release()
	}
}

// Limits bound one request: its operations, as the service counts them,
// and its approximate size in bytes.
type Limits struct {
	Ops, Bytes int
}

// Split encodes every ms[i], setting errs[i] to encode's error for a
// message that cannot be encoded, and passes the rest to send in order,
// in requests within lim: each with the index in ms of each item. A
// message over the limits alone is a request of its own. send must not
// keep the slices, which are reused.
func Split[E any](ms []*sink.Message, errs []error, lim Limits,
	encode func(*sink.Message) (e E, ops, size int, err error), send func(items []E, idx []int)) {
	var (
		items      []E
		idx        []int
		ops, bytes int
	)
	for i, m := range ms {
		e, n, size, err := encode(m)
		errs[i] = err
		if err != nil {
			continue
		}
		if len(items) > 0 && (ops+n > lim.Ops || bytes+size > lim.Bytes) {
			send(items, idx)
			items, idx, ops, bytes = items[:0], idx[:0], 0, 0
		}
		items = append(items, e)
		idx = append(idx, i)
		ops += n
		bytes += size
	}
	if len(items) > 0 {
		send(items, idx)
	}
}
