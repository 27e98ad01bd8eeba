// Package mem is the in-memory dedup store: the default, fastest, and
// forgotten on restart. A key costs about 30 bytes (a 128-bit hash and its
// expiry and message tag in a dense table, see store/internal/table),
// claimed or committed alike.
package mem

import (
	"context"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/internal/table"
)

// MaxHorizon is the longest horizon store.Open accepts for this store (New
// takes any): a horizon longer than months is an idempotency store, which
// memory is the wrong place for.
const MaxHorizon = 90 * 24 * time.Hour

const shardBits = 6

// Store is the in-memory store. The zero value is not usable; call New.
type Store struct {
	set *table.Set
}

var _ dedup.BatchStore = (*Store)(nil)

// New returns an empty store.
func New() *Store { return &Store{set: table.NewSet(shardBits, 0)} }

// Claim implements dedup.Store.
func (s *Store) Claim(_ context.Context, c dedup.Claim) (dedup.Verdict, error) {
	v, _ := s.set.Claim(c.Key, dedup.MsgTag(c.MsgID), c.Now.UnixNano(), c.LeaseUntil.UnixNano(), table.UnixNano(c.Extend))
	return v, nil
}

// Commit implements dedup.Store.
func (s *Store) Commit(_ context.Context, k dedup.Key, msgID string, expires time.Time) error {
	s.set.Commit(k, dedup.MsgTag(msgID), expires.UnixNano())
	return nil
}

// Release implements dedup.Store.
func (s *Store) Release(_ context.Context, k dedup.Key, msgID string) error {
	s.set.Release(k, dedup.MsgTag(msgID))
	return nil
}

// ClaimBatch implements dedup.BatchStore in one pass over the table,
// taking each shard's lock once.
func (s *Store) ClaimBatch(_ context.Context, cs []dedup.Claim, vs []dedup.Verdict, errs []error) {
	s.set.ClaimBatch(cs, vs, nil)
	clear(errs)
}

// CommitBatch implements dedup.BatchStore.
func (s *Store) CommitBatch(_ context.Context, es []dedup.Entry, errs []error) {
	s.set.CommitBatch(es)
	clear(errs)
}

// ReleaseBatch implements dedup.BatchStore.
func (s *Store) ReleaseBatch(_ context.Context, es []dedup.Entry, errs []error) {
	s.set.ReleaseBatch(es)
	clear(errs)
}

// Len is the number of keys held, expired ones not yet swept included.
func (s *Store) Len() int { return s.set.Len() }
