package redis

import (
	"context"
	"fmt"

	"github.com/dedupflow/dedupflow/dedup"
)

// ClaimBatch implements dedup.BatchStore: the claims go out as one pipeline
// (MaxBatch commands at most each), sent by the caller itself, and the
// sliding extensions of their duplicates, if any, as one more.
func (s *Store) ClaimBatch(ctx context.Context, cs []dedup.Claim, vs []dedup.Verdict, errs []error) {
	ops := make([]*op, len(cs))
	for i, c := range cs {
		ops[i] = s.claimOp(c)
	}
	s.b.direct(ctx, ops)
	var ext []*op
	var extended []int
	for i, o := range ops {
		vs[i], errs[i] = o.verdict, o.err
		if o.err == nil && o.verdict.Status == dedup.Duplicate && !cs[i].Extend.IsZero() {
			ext = append(ext, s.extendOp(cs[i]))
			extended = append(extended, i)
		}
	}
	s.b.recycle(ops)
	if len(ext) == 0 {
		return
	}
	s.b.direct(ctx, ext)
	for j, o := range ext {
		if o.err != nil {
			errs[extended[j]] = fmt.Errorf("extend key: %w", o.err)
		}
	}
	s.b.recycle(ext)
}

// CommitBatch implements dedup.BatchStore in one pipeline.
func (s *Store) CommitBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	ops := make([]*op, len(es))
	for i, e := range es {
		ops[i] = s.commitOp(e.Key, e.MsgID, e.Expires)
	}
	s.b.direct(ctx, ops)
	for i, o := range ops {
		errs[i] = o.err
	}
	s.b.recycle(ops)
}

// ReleaseBatch implements dedup.BatchStore in one pipeline.
func (s *Store) ReleaseBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	ops := make([]*op, len(es))
	for i, e := range es {
		ops[i] = s.releaseOp(e.Key, e.MsgID)
	}
	s.b.direct(ctx, ops)
	for i, o := range ops {
		errs[i] = o.err
	}
	s.b.recycle(ops)
}

// direct sends ops from the calling goroutine, as pipelines of up to
// MaxBatch commands, and answers each: a batch is already as large as the
// batcher's pipelines grow, so handing it to the batcher goroutines would
// only add a hand-over and a wake-up per op.
func (b *batcher) direct(ctx context.Context, ops []*op) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		for _, o := range ops {
			o.err = ErrClosed
		}
		return
	}
	for len(ops) > 0 {
		n := min(len(ops), b.max)
		tctx, cancel := context.WithTimeout(ctx, b.timeout)
		if b.wait > 0 {
			b.sendWait(tctx, ops[:n])
		} else {
			b.send(tctx, b.rdb, ops[:n], nil)
		}
		cancel()
		for _, o := range ops[:n] {
			<-o.done // answered by send: take the answer so the op can be reused
		}
		ops = ops[n:]
	}
}

// recycle returns answered ops to the pool.
func (b *batcher) recycle(ops []*op) {
	for _, o := range ops {
		b.ops.Put(o)
	}
}
