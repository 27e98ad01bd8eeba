package dedup

import (
	"context"
	"time"
)

// Entry is one key of a batch commit or release: the key, the message that
// holds it and, for a commit, when the key expires.
type Entry struct {
	Key     Key
	MsgID   string
	Expires time.Time // commits only
}

// BatchStore is a Store that also takes many calls in one: a claim of a
// whole StreamingPull response, the commit of every message its sink write
// confirmed, the release of those it failed, each in one pass over the
// store's table, one group commit or one round trip to its server.
//
// It is optional, beside Store rather than in it, so that a Store of your
// own keeps compiling and working: ClaimBatch, CommitBatch and ReleaseBatch
// below make one single call per item for a store without it, and a store
// gains the batch path by adding these three methods.
//
// A batch call has the effect of its items' single calls made one after
// another, in order: a key claimed twice in one batch is Proceed and then
// InFlight, as two claims would be. Items succeed or fail one by one: the
// store sets every errs[i] (nil on success), and vs[i] when errs[i] is nil.
// vs and errs are the caller's, as long as the items; a store keeps no
// reference to any of the slices after it returns.
type BatchStore interface {
	Store
	ClaimBatch(ctx context.Context, cs []Claim, vs []Verdict, errs []error)
	CommitBatch(ctx context.Context, es []Entry, errs []error)
	ReleaseBatch(ctx context.Context, es []Entry, errs []error)
}

// ClaimBatch claims every cs[i] into vs[i] and errs[i] through s: in one
// call when s is a BatchStore, else one Claim per item. A batch of one is
// a Claim: a store gathers the single calls that arrive together (a
// receiver that hands over one message at a time makes many at once) into
// its own batches, which one batch call of one item would bypass.
func ClaimBatch(ctx context.Context, s Store, cs []Claim, vs []Verdict, errs []error) {
	if bs, ok := s.(BatchStore); ok && len(cs) > 1 {
		bs.ClaimBatch(ctx, cs, vs, errs)
		return
	}
	for i := range cs {
		vs[i], errs[i] = s.Claim(ctx, cs[i])
	}
}

// CommitBatch commits every es[i] through s, setting errs[i]: in one call
// when s is a BatchStore, else one Commit per item.
func CommitBatch(ctx context.Context, s Store, es []Entry, errs []error) {
	if bs, ok := s.(BatchStore); ok && len(es) > 1 {
		bs.CommitBatch(ctx, es, errs)
		return
	}
	for i, e := range es {
		errs[i] = s.Commit(ctx, e.Key, e.MsgID, e.Expires)
	}
}

// ReleaseBatch releases every es[i] through s, setting errs[i]: in one
// call when s is a BatchStore, else one Release per item.
func ReleaseBatch(ctx context.Context, s Store, es []Entry, errs []error) {
	if bs, ok := s.(BatchStore); ok && len(es) > 1 {
		bs.ReleaseBatch(ctx, es, errs)
		return
	}
	for i, e := range es {
		errs[i] = s.Release(ctx, e.Key, e.MsgID)
	}
}
