package dedup

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Limits of the horizon.
const (
	MinHorizon     = time.Second
	DefaultHorizon = 10 * time.Minute
	DefaultLease   = 30 * time.Second
)

// Options configure a Deduper: its policy, its clock and how long a copy
// waits for this process's own write of its key.
type Options struct {
	Policy
	// Now is the clock.
	Now func() time.Time
	// LocalWait is how long, in real time, a copy of a key this process
	// is writing right now waits for that write to end before the claim
	// answers InFlight. Waiting turns the copy's verdict into Duplicate
	// (or Proceed, if the write failed) at once, where an InFlight nack
	// would cost a redelivery and a second claim. Zero answers at once.
	LocalWait time.Duration
}

// HorizonMode says whether a caught duplicate extends its key's life.
type HorizonMode uint8

const (
	// Fixed: a key lives for the horizon from first sight; a duplicate
	// does not extend it (as Beam's Deduplicate).
	Fixed HorizonMode = iota
	// Sliding: each caught duplicate keeps its key for another horizon
	// from that copy (as Vector's refresh_on_drop, Flink's
	// reset_ttl_on_duplicate).
	Sliding
)

// ParseHorizonMode reads a --horizon-mode value.
func ParseHorizonMode(s string) (HorizonMode, error) {
	switch s {
	case "fixed", "":
		return Fixed, nil
	case "sliding":
		return Sliding, nil
	}
	return 0, fmt.Errorf("unknown horizon mode %q: want fixed or sliding", s)
}

func (m HorizonMode) String() string {
	if m == Sliding {
		return "sliding"
	}
	return "fixed"
}

// Validate checks the options, filling defaults.
func (o *Options) Validate() error {
	if err := o.Policy.Validate(); err != nil {
		return err
	}
	if o.LocalWait < 0 {
		return fmt.Errorf("local wait %v must not be negative", o.LocalWait)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return nil
}

// Ticket is a held claim, to Commit or Release.
type Ticket struct {
	Key   Key
	MsgID string
	Seen  time.Time
	// Expires is when the key, once committed, expires; zero means Seen
	// plus the horizon.
	Expires time.Time
}

// Deduper runs the claim / commit / release protocol over a Store. It also
// keeps the keys this process is writing right now, so a redelivery that
// overtakes its own first delivery (an ack deadline that expired during a
// slow write) waits instead of being written twice.
type Deduper struct {
	store Store
	opt   Options

	mu    sync.Mutex
	local map[Key]claimant

	wm *watermark // event time only
}

// New returns a Deduper over store.
func New(store Store, opt Options) (*Deduper, error) {
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	d := &Deduper{store: store, opt: opt, local: make(map[Key]claimant)}
	if opt.TimeDomain == EventTime {
		d.wm = newWatermark(opt.AllowedLateness, opt.Now)
	}
	return d, nil
}

// Horizon is the horizon in force.
func (d *Deduper) Horizon() time.Duration { return d.opt.Horizon }

// Mode is the horizon mode in force.
func (d *Deduper) Mode() HorizonMode { return d.opt.HorizonMode }

// Lease is how long a claim holds.
func (d *Deduper) Lease() time.Duration { return d.opt.Lease }

// Claim asks for the right to write msgID, whose event time is et, under
// key k. Only with Proceed does the caller hold a Ticket. In processing
// time et is not used: the key expires a horizon after the claim. In event
// time see the time domain's rules at EventTime: et advances the
// watermark, and a message too late to judge gets ErrTooLate and no claim.
func (d *Deduper) Claim(ctx context.Context, k Key, msgID string, et time.Time) (Verdict, Ticket, error) {
	if d.wm != nil {
		if _, err := d.judge(et, d.wm.observe(et)); err != nil {
			return Verdict{}, Ticket{}, err
		}
	}
	entered, waited := d.enter(ctx, k, msgID)
	if !entered {
		return Verdict{Status: InFlight, Waited: waited}, Ticket{}, nil
	}
	// Read the clock (or the watermark) only once the key is held: a copy
	// may have waited up to LocalWait for it, and a lease measured from
	// before that wait would already be over for the other replicas that
	// judge it.
	now, expires, err := d.when(et)
	if err != nil {
		d.forget(k)
		return Verdict{Waited: waited}, Ticket{}, err
	}
	v, t, err := d.claim(ctx, k, msgID, now, expires)
	v.Waited = waited
	return v, t, err
}

// when is the time a claim is judged at (the processing clock, or the
// watermark) and when its key, once committed, expires; in event time,
// ErrTooLate for an event the watermark has passed by a horizon.
func (d *Deduper) when(et time.Time) (now, expires time.Time, err error) {
	if d.wm == nil {
		now = d.opt.Now()
		return now, now.Add(d.opt.Horizon), nil
	}
	now, _ = d.wm.get()
	expires, err = d.judge(et, now)
	return now, expires, err
}

// claim runs a claim, for a key this process holds (see enter), judged at
// now (the processing clock, or the watermark), for a key that, once
// committed, expires at expires.
func (d *Deduper) claim(ctx context.Context, k Key, msgID string, now, expires time.Time) (Verdict, Ticket, error) {
	c := Claim{Key: k, MsgID: msgID, Now: now, LeaseUntil: now.Add(d.opt.Lease)}
	if d.opt.HorizonMode == Sliding {
		c.Extend = expires
	}
	v, err := d.store.Claim(ctx, c)
	if v.Status == Duplicate && !v.Expires.IsZero() {
		// This copy's key would expire a horizon after its sight, the
		// stored one a horizon after the first (or latest) sight.
		v.Age = max(expires.Sub(v.Expires), 0)
	}
	if err != nil || v.Status != Proceed {
		d.forget(k)
		if err != nil {
			return Verdict{}, Ticket{}, fmt.Errorf("claim key: %w", err)
		}
		return v, Ticket{}, nil
	}
	return v, Ticket{Key: k, MsgID: msgID, Seen: now, Expires: expires}, nil
}

// Commit records the ticket's key as done, after the sink confirmed the
// write. On error the key stays pending until its lease ends: the write is
// in the sink, and a copy that slips through carries the key for the
// downstream reader.
func (d *Deduper) Commit(ctx context.Context, t Ticket) error {
	defer d.forget(t.Key)
	expires := t.Expires
	if expires.IsZero() {
		expires = t.Seen.Add(d.opt.Horizon)
	}
	if err := d.store.Commit(ctx, t.Key, t.MsgID, expires); err != nil {
		return fmt.Errorf("commit key: %w", err)
	}
	return nil
}

// Release gives the key up after a failed write, so the message can be
// retried.
func (d *Deduper) Release(ctx context.Context, t Ticket) error {
	defer d.forget(t.Key)
	if err := d.store.Release(ctx, t.Key, t.MsgID); err != nil {
		return fmt.Errorf("release key: %w", err)
	}
	return nil
}

// claimant is this process's claimant of a key; done is made by the first
// copy that waits, so a claim nobody waits for allocates nothing.
type claimant struct {
	msgID string
	done  chan struct{}
}

// enter makes msgID this process's claimant of k, waiting up to LocalWait
// (or until ctx ends) while another message of this process holds it. It
// reports how long it waited, on the Deduper's clock.
func (d *Deduper) enter(ctx context.Context, k Key, msgID string) (entered bool, waited time.Duration) {
	return d.await(ctx, k, msgID, true, d.opt.LocalWait)
}

// Await waits up to within (or until ctx ends) while another message of
// this process holds k (ClaimBatch's Here), and reports whether k is free
// now: a claim then finds that write's verdict, a Duplicate once it
// committed, instead of a nack and a redelivery.
func (d *Deduper) Await(ctx context.Context, k Key, within time.Duration) bool {
	free, _ := d.await(ctx, k, "", false, within)
	return free
}

// await waits up to within while another message of this process holds k;
// with take, msgID then holds it.
func (d *Deduper) await(ctx context.Context, k Key, msgID string, take bool, within time.Duration) (free bool, waited time.Duration) {
	var timeout <-chan time.Time
	var start time.Time
	for {
		d.mu.Lock()
		h, busy := d.local[k]
		if !busy {
			if take {
				d.local[k] = claimant{msgID: msgID}
			}
			d.mu.Unlock()
			return true, d.since(start)
		}
		if within <= 0 {
			d.mu.Unlock()
			return false, 0
		}
		if h.done == nil {
			h.done = make(chan struct{})
			d.local[k] = h
		}
		d.mu.Unlock()
		if timeout == nil {
			start = d.opt.Now()
			t := time.NewTimer(within)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-h.done: // the claimant committed or released: ask again
		case <-ctx.Done():
			return false, d.since(start)
		case <-timeout:
			return false, d.since(start)
		}
	}
}

// since is the time since start on the Deduper's clock; zero for a zero
// start (no wait).
func (d *Deduper) since(start time.Time) time.Duration {
	if start.IsZero() {
		return 0
	}
	return max(d.opt.Now().Sub(start), 0)
}

func (d *Deduper) forget(k Key) {
	d.mu.Lock()
	h := d.local[k]
	delete(d.local, k)
	d.mu.Unlock()
	if h.done != nil {
		close(h.done)
	}
}
