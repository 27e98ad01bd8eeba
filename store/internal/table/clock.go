package table

import "time"

const (
	tickNanos = int64(10 * time.Millisecond)
	// halfRange: tick 0 starts this long before the first time a table
	// sees, an expiry of a reloaded key or a claim's now alike, so times
	// years either side of it fit.
	halfRange = int64(maxTick/2) * tickNanos
)

// clock counts a table's times in ticks of 10 ms from a base of its own,
// so an expiry fits in the 35 bits an entry has for it.
type clock struct {
	base    int64  // Unix ns of tick 0
	now     uint64 // latest claim's tick, for the sweep
	started bool
}

// start sets the base from the first time the table sees.
func (c *clock) start(ns int64) {
	if !c.started {
		c.base, c.started = ns-halfRange, true
	}
}

// unix is the time (Unix ns) at which tick ends.
func (c *clock) unix(tick uint64) int64 { return c.base + int64(tick)*tickNanos }

// saw moves the sweep's clock to a claim's now.
func (c *clock) saw(ns int64) {
	c.start(ns)
	if at := c.at(ns); at > c.now {
		c.now = at
	}
}

// at is the tick of a claim's now, rounded down, so a live key is never
// judged expired.
func (c *clock) at(ns int64) uint64 {
	c.start(ns)
	d := ns - c.base
	if d <= 0 {
		return 0
	}
	return min(uint64(d/tickNanos), maxTick)
}

// until is the tick of an expiry or a lease's end, rounded up, so a key
// never expires early. A time past the clock's range (once in years of
// uptime) moves tick 0 up to halfRange before the latest claim (never
// past it: live keys must keep their place), rebasing t's entries; a
// time still out of range is held at the last tick: the key lives as long
// as the table can tell.
func (t *Table) until(ns int64) uint64 {
	c := &t.clock
	c.start(ns)
	d := ns - c.base
	if d <= 0 {
		return 1
	}
	ticks := (d + tickNanos - 1) / tickNanos
	if ticks > maxTick && c.now > maxTick/2 {
		delta := c.now - maxTick/2
		t.rebase(delta)
		c.base += int64(delta) * tickNanos
		c.now -= delta
		ticks = (ns - c.base + tickNanos - 1) / tickNanos
	}
	return uint64(min(ticks, maxTick))
}
