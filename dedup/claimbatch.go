package dedup

import (
	"context"
	"fmt"
)

// BatchClaim is one message of Deduper.ClaimBatch: its key and message ID
// in; its verdict, ticket (with Proceed) and error out.
type BatchClaim struct {
	Key   Key
	MsgID string

	Verdict Verdict
	Ticket  Ticket
	Err     error
	// Here: this process is writing the key right now, for another message
	// or for one earlier in the batch. The store was not asked and the
	// verdict is InFlight; claim the message again once that write ended
	// (the next batch, or Claim, which waits up to LocalWait for it): a
	// copy within one batch is then a Duplicate, not a nack.
	Here bool
}

// ClaimBatch claims every bs[i] in processing time, in one store call
// (dedup.ClaimBatch), at one reading of the clock. It never waits for this
// process's own writes: such a message is marked Here. In event time it
// claims one message at a time, as ClaimEvent at the processing clock.
func (d *Deduper) ClaimBatch(ctx context.Context, bs []BatchClaim) {
	if d.wm != nil {
		for i := range bs {
			b := &bs[i]
			b.Verdict, b.Ticket, b.Err = d.Claim(ctx, b.Key, b.MsgID)
		}
		return
	}
	now := d.opt.Now()
	expires := now.Add(d.opt.Horizon)
	cs := make([]Claim, 0, len(bs))
	at := make([]int, 0, len(bs)) // the message of each claim
	d.mu.Lock()
	for i := range bs {
		b := &bs[i]
		if _, busy := d.local[b.Key]; busy {
			b.Verdict, b.Here = Verdict{Status: InFlight}, true
			continue
		}
		d.local[b.Key] = claimant{msgID: b.MsgID}
		c := Claim{Key: b.Key, MsgID: b.MsgID, Now: now, LeaseUntil: now.Add(d.opt.Lease)}
		if d.opt.Mode == Sliding {
			c.Extend = expires
		}
		cs, at = append(cs, c), append(at, i)
	}
	d.mu.Unlock()
	vs, errs := make([]Verdict, len(cs)), make([]error, len(cs))
	ClaimBatch(ctx, d.store, cs, vs, errs)
	var done []Key // claims that hold nothing: this process is not writing them
	for j, i := range at {
		b, v := &bs[i], vs[j]
		if v.Status == Duplicate && !v.Expires.IsZero() {
			v.Age = max(expires.Sub(v.Expires), 0)
		}
		switch {
		case errs[j] != nil:
			b.Err = fmt.Errorf("claim key: %w", errs[j])
			done = append(done, b.Key)
		case v.Status != Proceed:
			b.Verdict = v
			done = append(done, b.Key)
		default:
			b.Verdict = v
			b.Ticket = Ticket{Key: b.Key, MsgID: b.MsgID, Seen: now, Expires: expires}
		}
	}
	d.forgetAll(done)
}

// CommitBatch commits every ts[i] (as Commit does) in one store call,
// setting errs[i].
func (d *Deduper) CommitBatch(ctx context.Context, ts []Ticket, errs []error) {
	es := d.entries(ts)
	CommitBatch(ctx, d.store, es, errs)
	d.settled(ts, errs, "commit key: %w")
}

// ReleaseBatch releases every ts[i] (as Release does) in one store call,
// setting errs[i].
func (d *Deduper) ReleaseBatch(ctx context.Context, ts []Ticket, errs []error) {
	ReleaseBatch(ctx, d.store, d.entries(ts), errs)
	d.settled(ts, errs, "release key: %w")
}

func (d *Deduper) entries(ts []Ticket) []Entry {
	es := make([]Entry, len(ts))
	for i, t := range ts {
		expires := t.Expires
		if expires.IsZero() {
			expires = t.Seen.Add(d.opt.Horizon)
		}
		es[i] = Entry{Key: t.Key, MsgID: t.MsgID, Expires: expires}
	}
	return es
}

// settled wraps the store's errors and lets go of the tickets' keys.
func (d *Deduper) settled(ts []Ticket, errs []error, format string) {
	keys := make([]Key, len(ts))
	for i, t := range ts {
		keys[i] = t.Key
		if errs[i] != nil {
			errs[i] = fmt.Errorf(format, errs[i])
		}
	}
	d.forgetAll(keys)
}

// forgetAll is forget of every key, under one lock.
func (d *Deduper) forgetAll(keys []Key) {
	if len(keys) == 0 {
		return
	}
	var waiting []chan struct{}
	d.mu.Lock()
	for _, k := range keys {
		if h, ok := d.local[k]; ok {
			delete(d.local, k)
			if h.done != nil {
				waiting = append(waiting, h.done)
			}
		}
	}
	d.mu.Unlock()
	for _, c := range waiting {
		close(c)
	}
}
