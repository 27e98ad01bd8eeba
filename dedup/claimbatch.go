package dedup

import (
	"context"
	"fmt"
	"time"
)

// BatchClaim is one message of Deduper.ClaimBatch: its key, message ID and
// event time (used in event time only) in; its verdict, ticket (with
// Proceed) and error out.
type BatchClaim struct {
	Key       Key
	MsgID     string
	EventTime time.Time

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

// ClaimBatch claims every bs[i] as Claim does, in one store call
// (dedup.ClaimBatch). In processing time every claim is judged at one
// reading of the clock; in event time each message's event time advances
// the watermark in batch order, and each is judged at the watermark after
// its own, as one Claim after another would. It never waits for this
// process's own writes: such a message is marked Here.
func (d *Deduper) ClaimBatch(ctx context.Context, bs []BatchClaim) {
	cs, at, expiries := d.enterBatch(bs)
	vs, errs := make([]Verdict, len(cs)), make([]error, len(cs))
	ClaimBatch(ctx, d.store, cs, vs, errs)
	d.answered(bs, cs, at, expiries, vs, errs)
}

// enterBatch marks the keys of bs as this process's own, judging each in
// event time, and returns the claims to make of the store: cs[j] is
// bs[at[j]]'s, which expires at expiries[at[j]]. It is apart from
// ClaimBatch so that the frames on the stack during the store call stay
// small.
func (d *Deduper) enterBatch(bs []BatchClaim) (cs []Claim, at []int, expiries []time.Time) {
	cs = make([]Claim, 0, len(bs))
	at = make([]int, 0, len(bs)) // the message of each claim
	expiries = make([]time.Time, len(bs))
	var now, expires time.Time
	if d.wm == nil { // one reading of the clock for the batch
		now = d.opt.Now()
		expires = now.Add(d.opt.Horizon)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for i := range bs {
		b := &bs[i]
		if d.wm != nil {
			now = d.wm.observe(b.EventTime)
			var err error
			if expires, err = d.judge(b.EventTime, now); err != nil {
				b.Err = err
				continue
			}
		}
		if _, busy := d.local[b.Key]; busy {
			b.Verdict, b.Here = Verdict{Status: InFlight}, true
			continue
		}
		d.local[b.Key] = claimant{msgID: b.MsgID}
		c := Claim{Key: b.Key, MsgID: b.MsgID, Now: now, LeaseUntil: now.Add(d.opt.Lease)}
		if d.opt.HorizonMode == Sliding {
			c.Extend = expires
		}
		expiries[i] = expires
		cs, at = append(cs, c), append(at, i)
	}
	return cs, at, expiries
}

// answered sets the verdicts, tickets and errors of bs from the store's
// answers to cs, and lets go of the keys no claim holds now.
func (d *Deduper) answered(bs []BatchClaim, cs []Claim, at []int, expiries []time.Time, vs []Verdict, errs []error) {
	var done []Key // claims that hold nothing: this process is not writing them
	for j, i := range at {
		b, v := &bs[i], &vs[j]
		if v.Status == Duplicate && !v.Expires.IsZero() {
			v.Age = max(expiries[i].Sub(v.Expires), 0)
		}
		switch {
		case errs[j] != nil:
			b.Err = fmt.Errorf("claim key: %w", errs[j])
			done = append(done, b.Key)
		case v.Status != Proceed:
			b.Verdict = *v
			done = append(done, b.Key)
		default:
			b.Verdict = *v
			b.Ticket = Ticket{Key: b.Key, MsgID: b.MsgID, Seen: cs[j].Now, Expires: expiries[i]}
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
