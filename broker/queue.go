package broker

// deque is a growable ring buffer. Subscriptions keep their backlog in one so
// that taking the next message and putting a redelivery back at the front are
// both O(1): delivery cost does not depend on how large the backlog is.
type deque[T any] struct {
	buf  []T
	head int
	n    int
}

func (d *deque[T]) len() int { return d.n }

func (d *deque[T]) grow() {
	size := len(d.buf) * 2
	if size < 16 {
		size = 16
	}
	nb := make([]T, size)
	for i := 0; i < d.n; i++ {
		nb[i] = d.buf[(d.head+i)%len(d.buf)]
	}
	d.buf, d.head = nb, 0
}

// reserve makes room for n more elements at once.
func (d *deque[T]) reserve(n int) {
	for len(d.buf)-d.n < n {
		d.grow()
	}
}

func (d *deque[T]) pushBack(v T) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.buf[(d.head+d.n)%len(d.buf)] = v
	d.n++
}

func (d *deque[T]) pushFront(v T) {
	if d.n == len(d.buf) {
		d.grow()
	}
	d.head = (d.head - 1 + len(d.buf)) % len(d.buf)
	d.buf[d.head] = v
	d.n++
}

func (d *deque[T]) front() T { return d.buf[d.head] }

func (d *deque[T]) at(i int) T { return d.buf[(d.head+i)%len(d.buf)] }

func (d *deque[T]) popFront() T {
	var zero T
	v := d.buf[d.head]
	d.buf[d.head] = zero // drop the reference so acknowledged messages can be collected
	d.head = (d.head + 1) % len(d.buf)
	d.n--
	if d.n == 0 {
		d.head = 0
		// A drained queue gives back a large buffer: a burst must not pin memory.
		if len(d.buf) > 1024 {
			d.buf = nil
		}
	}
	return v
}

// insertSorted puts v before the first element for which less(v, elem) holds.
// It is only used to put a redelivered ordered message back among the few
// queued messages of its own ordering key, usually at the front.
func (d *deque[T]) insertSorted(v T, less func(a, b T) bool) {
	i := 0
	for i < d.n && !less(v, d.at(i)) {
		i++
	}
	if i == 0 {
		d.pushFront(v)
		return
	}
	d.pushBack(v)
	for j := d.n - 1; j > i; j-- {
		d.buf[(d.head+j)%len(d.buf)] = d.buf[(d.head+j-1)%len(d.buf)]
	}
	d.buf[(d.head+i)%len(d.buf)] = v
}

// timerHeap orders leases by the time they need attention: an ack deadline
// that expires, or the end of a retry backoff. One heap for the whole broker
// lets a single goroutine serve every subscription, and it never scans
// messages that are not due.
type timerHeap []*lease

func (h timerHeap) less(i, j int) bool { return h[i].at < h[j].at }

func (h timerHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].hidx = i
	h[j].hidx = j
}

func (h *timerHeap) push(l *lease) {
	l.hidx = len(*h)
	*h = append(*h, l)
	h.up(l.hidx)
}

func (h *timerHeap) remove(l *lease) {
	i := l.hidx
	if i < 0 || i >= len(*h) || (*h)[i] != l {
		return
	}
	last := len(*h) - 1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	l.hidx = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h *timerHeap) fix(l *lease) {
	if !h.down(l.hidx) {
		h.up(l.hidx)
	}
}

func (h timerHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

func (h timerHeap) down(i0 int) bool {
	i := i0
	for {
		l := 2*i + 1
		if l >= len(h) {
			break
		}
		j := l
		if r := l + 1; r < len(h) && h.less(r, l) {
			j = r
		}
		if !h.less(j, i) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
