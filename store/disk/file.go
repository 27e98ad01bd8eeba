package disk

import (
	"bytes"
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
	bucketKeys = []byte("keys-by-expiry")
	bucketMeta = []byte("meta")
	keyVersion = []byte("version")
)

const (
	formatVersion = 1
	recKeyLen     = 8 + len(dedup.Key{}) // big-endian expiry, then the key
	recValLen     = 4                    // message tag
	// idleSweep bounds one idle sweep transaction, so a commit that
	// arrives behind it waits milliseconds, not the whole backlog.
	idleSweep = 20000
)

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

	// examined counts records the sweeps looked at, so a test can check
	// that sweeping never walks the live keys.
	examined atomic.Int64
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
		_, err = tx.CreateBucketIfNotExists(bucketKeys)
		return err
	})
}

// load rebuilds the index from the file, a chunk of records at a time.
// Inserting records straight into the tables in file order would touch a
// random spot of hundreds of megabytes per key, a cache and TLB miss each
// (measured: 30 s for 10M keys under load); instead each chunk is split by
// shard into flat slices (sequential writes), then every shard's table
// takes its slice, within a megabyte or two. One goroutine indexes a chunk
// while the cursor fills the other buffer, so on two cores the load takes
// about as long as the longer of the two. The buffers are reused: fresh
// pages cost a fault each, which on a busy VM was much of the time.
// Records come in expiry order, so a key committed twice ends with its
// later expiry, as Commit keeps it.
func (w *writer) load(ctx context.Context) (int, error) {
	const (
		nshards = 1 << shardBits
		chunk   = 1 << 20 // records per chunk: 32 MiB per buffer
	)
	start := time.Now()
	var bufs [2][nshards][]loadRec
	var indexer sync.WaitGroup
	index := func(parts *[nshards][]loadRec) {
		indexer.Wait() // the previous chunk first: later records win
		indexer.Go(func() {
			for i := range parts {
				sh := &w.s.shards[i]
				for _, r := range parts[i] {
					sh.setDone(r.k, rec{exp: r.exp, tag: r.tag}) // not shared yet: no lock
				}
				parts[i] = parts[i][:0]
			}
		})
	}
	n := 0
	err := w.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		// The sequence holds an estimate of the record count: size the
		// tables once rather than grow ten million keys step by step.
		per := int(b.Sequence() / nshards)
		for i := range w.s.shards {
			w.s.shards[i].done = newIndex(per + per/16)
		}
		c := b.Cursor()
		cur, inChunk := 0, 0
		parts := &bufs[cur]
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) != recKeyLen || len(v) != recValLen {
				return fmt.Errorf("corrupt record %x=%x", k, v)
			}
			var r loadRec
			r.exp = int64(binary.BigEndian.Uint64(k))
			copy(r.k[:], k[8:])
			r.tag = max(binary.LittleEndian.Uint32(v), 1) // 0 marks a free slot
			i := r.k.Hi() >> (64 - shardBits)
			parts[i] = append(parts[i], r)
			n++
			if inChunk++; inChunk == chunk {
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
	k   dedup.Key
	exp int64
	tag uint32
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

// write commits a group in one transaction, sweeping up to twice as many
// expired records as it adds (so the file shrinks as fast as it grows) at
// no extra fsync. It reports whether expired records remain.
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
		b := tx.Bucket(bucketKeys)
		// Keys arrive nearly in order, so full pages stay full.
		b.FillPercent = 0.9
		// bbolt keeps the slices until the transaction ends: one slab.
		const size = recKeyLen + recValLen
		buf := make([]byte, len(g.keys)*size)
		recs := make([][]byte, len(g.keys))
		for i, k := range g.keys {
			r := buf[i*size : (i+1)*size]
			binary.BigEndian.PutUint64(r, uint64(max(g.recs[i].exp, 0)))
			copy(r[8:], k[:])
			binary.LittleEndian.PutUint32(r[recKeyLen:], g.recs[i].tag)
			recs[i] = r
		}
		// In key order, each Put lands on the leaf the last one touched.
		slices.SortFunc(recs, func(x, y []byte) int { return bytes.Compare(x[:recKeyLen], y[:recKeyLen]) })
		for _, r := range recs {
			if err := b.Put(r[:recKeyLen], r[recKeyLen:]); err != nil {
				return err
			}
		}
		var err error
		swept, more, err = w.sweepTx(b, now, limit)
		if err != nil {
			return err
		}
		seq := b.Sequence() + uint64(len(g.keys))
		return b.SetSequence(seq - min(seq, uint64(len(swept))))
	})
	if g.err != nil {
		// A failed write (disk full, I/O error) may heal: callers nack and
		// retry rather than drop.
		w.log.Error("state file write failed", "keys", len(g.keys), "err", g.err)
		g.err = fmt.Errorf("write state file: %w: %w", dedup.ErrUnavailable, g.err)
		return false
	}
	w.s.forget(swept)
	if len(swept) > 0 {
		w.log.Debug("swept expired keys", "n", len(swept))
	}
	return more
}

// expiredAny reports whether the oldest record has expired by now.
func (w *writer) expiredAny(now int64) bool {
	any := false
	_ = w.db.View(func(tx *bolt.Tx) error {
		k, _ := tx.Bucket(bucketKeys).Cursor().First()
		any = k != nil && int64(binary.BigEndian.Uint64(k)) <= now
		return nil
	})
	return any
}

// sweepTx deletes up to limit records that expired by now (expiry <= now,
// as a claim at now would find them expired). Records are ordered by
// expiry, so it reads the expired ones and the first live one, no more.
func (w *writer) sweepTx(b *bolt.Bucket, now int64, limit int) ([]sweptKey, bool, error) {
	var swept []sweptKey
	more := false
	c := b.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		w.examined.Add(1)
		exp := int64(binary.BigEndian.Uint64(k))
		if exp > now {
			break
		}
		if len(swept) == limit {
			more = true
			break
		}
		var key dedup.Key
		copy(key[:], k[8:])
		swept = append(swept, sweptKey{k: key, exp: exp})
	}
	// Deleting under a moving cursor skips records in bbolt; delete after.
	kb := make([]byte, recKeyLen)
	for _, x := range swept {
		binary.BigEndian.PutUint64(kb, uint64(max(x.exp, 0)))
		copy(kb[8:], x.k[:])
		if err := b.Delete(kb); err != nil {
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
			b := tx.Bucket(bucketKeys)
			var err error
			swept, more, err = w.sweepTx(b, now, idleSweep)
			if err != nil {
				return err
			}
			return b.SetSequence(b.Sequence() - min(b.Sequence(), uint64(len(swept))))
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
