// Package disk is the dedup store whose horizon survives restarts and
// kill -9: committed keys are kept in a Pebble database (a directory) and,
// for speed, in an in-memory index rebuilt from it when it is opened.
//
// # Layout
//
// The database is a log of group commits: each write adds one entry whose
// key is the latest expiry in the group (8 bytes, big-endian Unix ns) and a
// sequence number, and whose value is the group's records (dedup key,
// expiry, message tag: 28 bytes each). So a write is one Set of one
// contiguous value however many commits share it (a Set per commit made
// the engine's per-key work, not the fsync, the limit), and entries are
// ordered by expiry: the sweep reads expired groups from the left edge,
// from where the previous sweep stopped, and stops at the first live one;
// it never reads live keys. A group stays until its last key expires; the
// index judges every key by its own expiry, so the others only linger on
// disk, by about a lease at most. Claims never read the database: a point
// read from Pebble costs many times a claim in memory.
//
// Swept groups are not deleted one by one: deletes at the front of a queue
// are what an LSM tree handles worst (tombstones that every later scan
// steps over, and each flushed table then spans from the oldest key to the
// newest, so compacting it rewrites every live table in between). Instead
// the swept prefix is excised (Pebble drops the tables inside the range
// and narrows the one at its edge: no compaction, no tombstone) once 64 MiB
// of it piled up or a minute passed, on Sweep, and on Close.
//
// # Durability (fsync policy)
//
// By default Commit returns only after its key is in a Pebble batch whose
// write-ahead-log record has been fdatasynced, so a key whose Commit
// returned survives kill -9 and power loss (the WAL's records are
// checksummed: a torn tail is cut at open, never misread). Concurrent
// commits are grouped: one writer goroutine puts every commit queued while
// the previous batch was syncing into the next one, so a thousand callers
// share one fsync instead of queueing for a thousand. Options.NoSync skips
// the fsync and the wait for the WAL write: a crash may lose the last
// moments of commits.
//
// Pending claims live only in memory, in the index's table: a claim is
// the slot its commit then overwrites (as in store/mem), so claim and
// commit touch one table and no Go map. A lease only matters while its holder
// is alive, and the holder is this process (the directory is locked, so no
// other process shares it): after a restart no one holds any lease, so a
// forgotten claim is exactly right, and keeping them durable would cost an
// fsync per claim for nothing.
//
// A write Pebble could not make (a full or read-only disk, a directory
// that is gone) leaves its commit pipeline unusable, so it fails that
// commit and every later one with dedup.ErrFatal: a restart, which reopens
// the database, is what heals it.
//
// # Why Pebble, not bbolt
//
// bbolt (this store's engine before) commits a transaction with two
// fdatasyncs, data pages then the meta page, plus page copies and the
// freelist; Pebble commits a batch with one, of a WAL appended
// sequentially, and measured faster under load (BENCHMARKS.md, component
// measurements). The price is a dependency with background work (flushes;
// with expiry-ordered keys and excision instead of deletes, compactions are
// mostly moves) and a directory instead of one file.
//
// # Memory, expiry and reopen
//
// The index is store/mem's table (store/internal/table): about 30 bytes
// per live key or pending claim, the database about 28 per key. Expired
// keys and lapsed claims are removed from the index by a cursor that every
// new claim moves a few slots on and, when the store is idle, every
// SweepEvery; from the database by the ordered sweep, which follows each
// write (no extra fsync) and runs on the same tick. "Now" for the sweep is
// the latest Claim.Now seen, so expiry follows the injected clock, never
// the wall clock. Reopening is mostly building the index (see load).
package disk

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/internal/table"
)

// MaxHorizon is the longest horizon this store accepts. Nothing in the file
// format limits it; the bound keeps --horizon from silently asking for an
// index that grows for a year.
const MaxHorizon = 366 * 24 * time.Hour

// ErrClosed is returned by calls on a closed store.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("disk store closed: %w", dedup.ErrFatal)

// Options configure a Store.
type Options struct {
	// Logger receives sweep and open reports; nil discards them.
	Logger *slog.Logger
	// NoSync makes Commit return once its batch is in Pebble's memtable
	// and WAL buffer, without waiting for the WAL's write or fsync: a
	// crash of the process or the machine may lose the last commits. For
	// benchmarks and throwaway state.
	NoSync bool
	// SweepEvery is how often an idle store deletes expired keys; commits
	// sweep as they go. Default 1s.
	SweepEvery time.Duration

	fs  vfs.FS           // Pebble's file system, for tests that inject faults; nil is the disk
	now func() time.Time // the clock of the log's rate limit, for tests; nil is time.Now
}

// shardBits: 256 shards keep lock contention low with a thousand callers
// and, more to the point, keep each shard's table small enough (40k keys
// at 10M) to be built from cache when the database is loaded (see load).
const shardBits = 8

// Store is the disk store. Open it with Open; close it with Close.
type Store struct {
	log    *slog.Logger
	set    *table.Set // committed keys and pending claims
	w      *writer
	closed atomic.Bool
}

// rec is a committed key as the database holds it.
type rec struct {
	exp int64 // Unix ns
	tag uint32
}

var _ dedup.BatchStore = (*Store)(nil)

// Open opens (creating if needed) the store directory at path and loads
// its live keys. It fails after a second if another process holds it.
func Open(ctx context.Context, path string, opt Options) (*Store, error) {
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.now == nil {
		opt.now = time.Now
	}
	if opt.SweepEvery <= 0 {
		opt.SweepEvery = time.Second
	}
	s := &Store{log: opt.Logger}
	w, err := openWriter(ctx, path, opt, s)
	if err != nil {
		return nil, err
	}
	s.w = w
	return s, nil
}

// Claim implements dedup.Store.
//
// With Claim.Extend (the sliding horizon), a duplicate's new expiry is
// written like a commit and the claim returns once it is durable, so a
// restart keeps the extended key.
func (s *Store) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	if s.closed.Load() {
		return dedup.Verdict{}, ErrClosed
	}
	tag := dedup.MsgTag(c.MsgID)
	if c.Extend.IsZero() {
		v, _ := s.set.Claim(c.Key, tag, c.Now.UnixNano(), c.LeaseUntil.UnixNano(), 0)
		return v, nil
	}
	v, owner := s.set.Claim(c.Key, tag, c.Now.UnixNano(), c.LeaseUntil.UnixNano(), c.Extend.UnixNano())
	if v.Status == dedup.Duplicate && c.Extend.After(v.Expires) {
		// The key stays its first message's, whichever copy extended it, so
		// that message's redelivery after a restart is still one.
		if err := s.w.put(ctx, c.Key, rec{exp: c.Extend.UnixNano(), tag: owner}); err != nil {
			return dedup.Verdict{}, err
		}
	}
	return v, nil
}

// Commit implements dedup.Store. It returns once the key is durable (see
// the package doc); only then does the index call the key done, so a copy
// that arrives meanwhile is told InFlight (and retried), not Duplicate on
// the strength of a write that might still fail.
func (s *Store) Commit(ctx context.Context, k dedup.Key, msgID string, expires time.Time) error {
	r := rec{exp: expires.UnixNano(), tag: dedup.MsgTag(msgID)}
	if err := s.w.put(ctx, k, r); err != nil {
		return err
	}
	s.set.Commit(k, r.tag, r.exp) // done now, whoever held the lease
	return nil
}

// Release implements dedup.Store. The claim is told by its message-ID tag,
// as in store/mem: the slot has no room for the ID.
func (s *Store) Release(_ context.Context, k dedup.Key, msgID string) error {
	if s.closed.Load() {
		return ErrClosed
	}
	s.set.Release(k, dedup.MsgTag(msgID))
	return nil
}

// ClaimBatch implements dedup.BatchStore: one pass over the index, and the
// sliding extensions of its duplicates, if any, in one group commit.
func (s *Store) ClaimBatch(ctx context.Context, cs []dedup.Claim, vs []dedup.Verdict, errs []error) {
	if s.closed.Load() {
		failAll(errs, ErrClosed)
		return
	}
	clear(errs)
	owners := make([]uint32, len(cs))
	s.set.ClaimBatch(cs, vs, owners)
	var keys []dedup.Key
	var recs []rec
	var extended []int
	for i := range cs {
		if vs[i].Status == dedup.Duplicate && !cs[i].Extend.IsZero() && cs[i].Extend.After(vs[i].Expires) {
			keys = append(keys, cs[i].Key)
			recs = append(recs, rec{exp: cs[i].Extend.UnixNano(), tag: owners[i]})
			extended = append(extended, i)
		}
	}
	if len(keys) == 0 {
		return
	}
	if err := s.w.putMany(ctx, keys, recs); err != nil {
		for _, i := range extended {
			vs[i], errs[i] = dedup.Verdict{}, err
		}
	}
}

// CommitBatch implements dedup.BatchStore: every key in one group commit
// (one batch, one fsync, shared with concurrent callers), then done in the
// index in one pass.
func (s *Store) CommitBatch(ctx context.Context, es []dedup.Entry, errs []error) {
	if len(es) == 0 {
		return
	}
	keys := make([]dedup.Key, len(es))
	recs := make([]rec, len(es))
	for i, e := range es {
		keys[i], recs[i] = e.Key, rec{exp: e.Expires.UnixNano(), tag: dedup.MsgTag(e.MsgID)}
	}
	if err := s.w.putMany(ctx, keys, recs); err != nil {
		failAll(errs, err)
		return
	}
	s.set.CommitBatch(es)
	clear(errs)
}

// ReleaseBatch implements dedup.BatchStore.
func (s *Store) ReleaseBatch(_ context.Context, es []dedup.Entry, errs []error) {
	if s.closed.Load() {
		failAll(errs, ErrClosed)
		return
	}
	s.set.ReleaseBatch(es)
	clear(errs)
}

func failAll(errs []error, err error) {
	for i := range errs {
		errs[i] = err
	}
}

// Len is the number of keys held, pending claims and committed keys that
// expired but were not swept yet included.
func (s *Store) Len() int { return s.set.Len() }

// walkSlots is how many slots of each shard one idle tick sweeps: 1M slots
// (24 MiB) a tick in all, so a 10M-key index is walked in about 12 ticks,
// a small one at every tick. Claims that insert sweep as they go; the tick
// is for a store that is idle, whose lapsed claims and expired keys would
// otherwise stay.
const walkSlots = 4096

// Sweep deletes every key that expired by now from the database and the
// index and returns how many records it deleted from the database. The
// store sweeps by itself; Sweep is for tests and tools.
func (s *Store) Sweep(ctx context.Context, now time.Time) (int, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	n, err := s.w.sweepAll(ctx, now.UnixNano())
	s.set.Sweep(-1, now.UnixNano())
	return n, err
}

// Close flushes queued commits, stops the writer and closes the file.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	return s.w.close()
}
