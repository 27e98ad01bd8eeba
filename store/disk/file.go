package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/dedupflow/dedupflow/dedup"
)

var (
	bucketGroups = []byte("groups-by-expiry")
	bucketMeta   = []byte("meta")
	keyVersion   = []byte("version")
)

// The file holds one bbolt entry per group commit: the key is the largest
// expiry in the group (8 bytes, big-endian) and a sequence number (8 bytes),
// the value the group's records, recLen bytes each.
const (
	formatVersion = 2
	groupKeyLen   = 16
	recLen        = 16 + 8 + 4 // dedup key, expiry (Unix ns, big-endian), tag (little-endian)
	// idleSweep bounds the records one idle sweep transaction deletes, so
	// a commit that arrives behind it waits milliseconds, not the backlog.
	idleSweep = 20000
)

func putRec(b []byte, k dedup.Key, r rec) {
	copy(b, k[:])
	binary.BigEndian.PutUint64(b[16:], uint64(max(r.exp, 0)))
	binary.LittleEndian.PutUint32(b[24:], r.tag)
}

func getRec(b []byte) (dedup.Key, rec) {
	var k dedup.Key
	copy(k[:], b)
	return k, rec{
		exp: int64(binary.BigEndian.Uint64(b[16:])),
		tag: max(binary.LittleEndian.Uint32(b[24:]), 1), // 0 marks a free slot in the index
	}
}

func groupExp(k []byte) int64 { return int64(binary.BigEndian.Uint64(k)) }

// writer owns the bbolt file: the one goroutine that writes it, grouping
// concurrent commits into one transaction, and the sweep.
type writer struct {
	s     *Store
	db    *bolt.DB
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	cur    *group
	closed bool

	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}

	// examined counts groups the sweeps looked at, so a test can check
	// that sweeping never walks the live keys.
	examined atomic.Int64
	// txs and keys count write transactions and the commits they carried:
	// keys/txs is the group-commit factor.
	txs, keys atomic.Int64
}

// group is the set of commits that share one transaction and one fsync.
type group struct {
	keys []dedup.Key
	recs []rec
	done chan struct{} // closed when err is set
	err  error
}

type sweptKey struct {
	k   dedup.Key
	exp int64
}

func newGroup() *group { return &group{done: make(chan struct{})} }

func openWriter(ctx context.Context, path string, opt Options, s *Store) (*writer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: time.Second,
		// The freelist is written with every commit (one page more per
		// fsync) rather than rebuilt on open: rebuilding walks every page,
		// 0.7 s of CPU at 10M keys.
		FreelistType: bolt.FreelistMapType,
		NoSync:       opt.NoSync,
		MmapFlags:    mmapFlags,
	})
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open state file %s: another process holds it", path)
	}
	if err != nil {
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	w := &writer{
		s: s, db: db, log: opt.Logger, every: opt.SweepEvery,
		cur:  newGroup(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{}),
	}
	if err := w.init(); err != nil {
		db.Close()
		return nil, fmt.Errorf("open state file %s: %w", path, err)
	}
	n, err := w.load(ctx)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("load state file %s: %w", path, err)
	}
	w.log.Info("state file opened", "path", path, "keys", n, "took", time.Since(start).Round(time.Millisecond))
	go w.loop()
	return w, nil
}

// init creates the buckets of a new file and checks the version of an old
// one, so a future layout is refused instead of misread.
func (w *writer) init() error {
	return w.db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucketIfNotExists(bucketMeta)
		if err != nil {
			return err
		}
		if v := meta.Get(keyVersion); v != nil {
			if len(v) != 4 || binary.BigEndian.Uint32(v) != formatVersion {
				return fmt.Errorf("unsupported state file version %x (want %d)", v, formatVersion)
			}
		} else if err := meta.Put(keyVersion, binary.BigEndian.AppendUint32(nil, formatVersion)); err != nil {
			return err
		}
		_, err = tx.CreateBucketIfNotExists(bucketGroups)
		return err
	})
}

// load rebuilds the index from the file. Inserting records straight into
// the tables in file order would touch a random spot of hundreds of
// megabytes per key, a cache and TLB miss each (measured: 30 s for 10M keys
// under load); instead a chunk of records is split by shard into flat
// slices (sequential writes), then every shard's table takes its slice,
// within a megabyte or two. One goroutine indexes a chunk while the cursor
// fills the other buffer, so on two cores the load takes about as long as
// the longer of the two. The buffers are reused: fresh pages cost a fault
// each, which on a busy VM was much of the time. A key committed twice
// keeps its later expiry, as Commit keeps it.
func (w *writer) load(ctx context.Context) (int, error) {
	const (
		nshards = 1 << shardBits
		chunk   = 1 << 20 // records per chunk: 32 MiB per buffer
	)
	start := time.Now()
	var bufs [2][nshards][]loadRec
	var indexer sync.WaitGroup
	index := func(parts *[nshards][]loadRec) {
		indexer.Wait()
		indexer.Go(func() {
			for i := range parts {
				sh := &w.s.shards[i]
				for _, r := range parts[i] {
					sh.setDone(r.k, r.rec) // not shared yet: no lock
				}
				parts[i] = parts[i][:0]
			}
		})
	}
	n := 0
	err := w.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketGroups).Cursor()
		// Count first (one step per group, not per record) to size the
		// tables once rather than grow them ten million keys long.
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != groupKeyLen || len(v)%recLen != 0 {
				return fmt.Errorf("corrupt group %x (%d bytes)", k, len(v))
			}
			n += len(v) / recLen
		}
		per := n / nshards
		for i := range w.s.shards {
			w.s.shards[i].done = newIndex(per + per/16)
		}
		cur, inChunk := 0, 0
		parts := &bufs[cur]
		for k, v := c.First(); k != nil; k, v = c.Next() {
			inChunk += len(v) / recLen
			for ; len(v) > 0; v = v[recLen:] {
				key, r := getRec(v)
				i := key.Hi() >> (64 - shardBits)
				parts[i] = append(parts[i], loadRec{key, r})
			}
			if inChunk >= chunk {
				if err := ctx.Err(); err != nil {
					return err
				}
				index(parts)
				cur, inChunk = 1-cur, 0
				parts = &bufs[cur]
			}
		}
		index(parts)
		return nil
	})
	indexer.Wait()
	if err != nil {
		return 0, err
	}
	w.log.Debug("state file loaded", "keys", n, "took", time.Since(start).Round(time.Millisecond))
	return n, nil
}

type loadRec struct {
	k dedup.Key
	rec
}

// put queues one commit and waits until its group is durable.
func (w *writer) put(ctx context.Context, k dedup.Key, r rec) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	g := w.cur
	g.keys = append(g.keys, k)
	g.recs = append(g.recs, r)
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
	select {
	case <-g.done:
		return g.err
	case <-ctx.Done():
		// The write may still land; that is harmless, the sink has it.
		return ctx.Err()
	}
}

func (w *writer) take() *group {
	w.mu.Lock()
	defer w.mu.Unlock()
	g := w.cur
	w.cur = newGroup()
	return g
}

// loop is the writer goroutine. While one transaction syncs, commits pile
// up in the next group: that is the whole group-commit mechanism, with no
// timer to tune.
func (w *writer) loop() {
	defer close(w.exited)
	t := time.NewTicker(w.every)
	defer t.Stop()
	for {
		stopping, tick := false, false
		select {
		case <-w.wake:
		case <-t.C:
			tick = true
		case <-w.stop:
			stopping = true // closed is set: this take gets the last group
		}
		now := w.s.now()
		if tick {
			w.s.dropStaleClaims(now)
		}
		g := w.take()
		more := w.write(g, now)
		if stopping {
			return
		}
		if more {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

// write commits a group as one bbolt entry in one transaction: one Put of
// one contiguous value, however many commits share it (a Put per commit
// made bbolt's B+tree work, not the fsync, the limit). It also sweeps up
// to twice as many expired records as it adds, so the file shrinks as fast
// as it grows, at no extra fsync. It reports whether expired groups remain.
func (w *writer) write(g *group, now int64) (more bool) {
	defer close(g.done)
	limit := 2*len(g.keys) + 256
	if len(g.keys) == 0 {
		if !w.expiredAny(now) {
			return false // nothing to do: skip an empty fsync
		}
		limit = idleSweep
	}
	var swept []sweptKey
	g.err = w.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketGroups)
		if len(g.keys) > 0 {
			v := make([]byte, len(g.keys)*recLen)
			var maxExp int64
			for i, k := range g.keys {
				putRec(v[i*recLen:], k, g.recs[i])
				maxExp = max(maxExp, g.recs[i].exp)
			}
			seq, err := b.NextSequence()
			if err != nil {
				return err
			}
			k := binary.BigEndian.AppendUint64(nil, uint64(max(maxExp, 0)))
			if err := b.Put(binary.BigEndian.AppendUint64(k, seq), v); err != nil {
				return err
			}
		}
		var err error
		swept, more, err = w.sweepTx(b, now, limit)
		return err
	})
	if g.err != nil {
		// A failed write (disk full, I/O error) may heal: callers nack and
		// retry rather than drop.
		w.log.Error("state file write failed", "keys", len(g.keys), "err", g.err)
		g.err = fmt.Errorf("write state file: %w: %w", dedup.ErrUnavailable, g.err)
		return false
	}
	w.txs.Add(1)
	w.keys.Add(int64(len(g.keys)))
	w.s.forget(swept)
	if len(swept) > 0 {
		w.log.Debug("swept expired keys", "n", len(swept))
	}
	return more
}

// expiredAny reports whether the oldest group has expired by now.
func (w *writer) expiredAny(now int64) bool {
	any := false
	_ = w.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bucketGroups).Cursor().First()
		any = k != nil && groupExp(k) <= now
		return nil
	})
	return any
}

// sweepTx deletes the groups whose every record expired by now (expiry <=
// now, as a claim at now would find them expired), up to about limit
// records. Groups are ordered by their latest expiry, so it reads the
// expired ones and the first live one, no more. A group lives until its
// last record expires: the index judges each record by its own expiry, so
// the others only linger on disk, by about the lease at most.
func (w *writer) sweepTx(b *bolt.Bucket, now int64, limit int) ([]sweptKey, bool, error) {
	var swept []sweptKey
	var dead [][]byte
	more := false
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		w.examined.Add(1)
		if groupExp(k) > now {
			break
		}
		if len(swept) > 0 && len(swept)+len(v)/recLen > limit {
			more = true
			break
		}
		for ; len(v) >= recLen; v = v[recLen:] {
			key, r := getRec(v)
			swept = append(swept, sweptKey{k: key, exp: r.exp})
		}
		dead = append(dead, slices.Clone(k))
	}
	// Deleting under a moving cursor skips entries in bbolt; delete after.
	for _, k := range dead {
		if err := b.Delete(k); err != nil {
			return nil, false, err
		}
	}
	return swept, more, nil
}

// sweepAll sweeps everything that expired by now, one bounded transaction
// at a time (bbolt serialises them with the writer's).
func (w *writer) sweepAll(ctx context.Context, now int64) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		var swept []sweptKey
		more := false
		err := w.db.Update(func(tx *bolt.Tx) error {
			var err error
			swept, more, err = w.sweepTx(tx.Bucket(bucketGroups), now, idleSweep)
			return err
		})
		if err != nil {
			return total, fmt.Errorf("sweep state file: %w", err)
		}
		w.s.forget(swept)
		total += len(swept)
		if !more {
			return total, nil
		}
	}
}

func (w *writer) close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.exited
	if err := w.db.Close(); err != nil {
		return fmt.Errorf("close state file: %w", err)
	}
	return nil
}
