package disk

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/internal/table"
)

// The store holds one entry per group commit: the key is the largest
// expiry in the group (8 bytes, big-endian, so positive expiries start
// below 0x80) and a sequence number (8 bytes), the value the group's
// records, recLen bytes each. Other keys start with 0xff, after every group.
const (
	formatVersion = 3
	groupKeyLen   = 16
	recLen        = 16 + 8 + 4 // dedup key, expiry (Unix ns, big-endian), tag (little-endian)
	// idleSweep bounds the records one idle sweep reads, so a commit
	// queued behind it waits milliseconds, not the backlog.
	idleSweep = 20000
	// exciseAfter: swept groups are cut from the database once this many
	// bytes of them piled up (or a minute passed), not at every sweep:
	// each cut rewrites the manifest.
	exciseAfter = 64 << 20
	exciseEvery = time.Minute
)

var (
	keyVersion = []byte("\xffversion")
	groupsEnd  = []byte{0xff}
	groupsLow  = []byte{0x00}
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
		tag: binary.LittleEndian.Uint32(b[24:]),
	}
}

func groupExp(k []byte) int64 { return int64(binary.BigEndian.Uint64(k)) }

func groupKey(b []byte, exp int64, seq uint64) {
	binary.BigEndian.PutUint64(b, uint64(max(exp, 0)))
	binary.BigEndian.PutUint64(b[8:], seq)
}

// writer owns the Pebble database: the one goroutine that writes it,
// grouping concurrent commits into one batch, and the sweep.
type writer struct {
	s     *Store
	path  string
	db    *pebble.DB
	wo    *pebble.WriteOptions
	log   *slog.Logger
	every time.Duration

	mu     sync.Mutex
	cur    *group
	closed bool
	// failed is the error of a write the database could not make; every
	// commit after it fails with it (see write).
	failed error
	// spareKeys and spareRecs are the slices of the last group written,
	// for the next group to fill: growing fresh ones by append for every
	// group of hundreds of commits cost more than the write's syscalls.
	// The writer goroutine's alone.
	spareKeys []dedup.Key
	spareRecs []rec

	wake   chan struct{}
	stop   chan struct{}
	exited chan struct{}

	// txMu serialises the writer's batches and sweeps with Sweep's, and
	// guards what follows.
	txMu sync.Mutex
	seq  uint64
	// swept: every group below this key has been swept (nil: none
	// yet). Sweeps start here, so they never step over the
	// swept groups still in the database.
	swept []byte
	// nextExp: no group the sweep has not read yet expires before this
	// (the first live group it stopped at, or a group written since), so
	// most sweeps are skipped without opening an iterator.
	nextExp int64
	// unexcised counts bytes of swept groups still in the database.
	unexcised  int64
	lastExcise time.Time
	// lock is the directory's, taken before Pebble opens it so that a
	// second process can be told apart from other failures.
	lock *pebble.Lock

	// examined counts groups the sweeps looked at, so a test can check
	// that sweeping never walks the live keys.
	examined atomic.Int64
	// txs and keys count write batches and the commits they carried:
	// keys/txs is the group-commit factor.
	txs, keys atomic.Int64
}

// group is the set of commits that share one batch and one fsync.
type group struct {
	keys []dedup.Key
	recs []rec
	done chan struct{} // closed when err is set
	err  error
}

func newGroup() *group { return &group{done: make(chan struct{})} }

// Fatalf is how Pebble reports a write it could not make (its commit
// pipeline cannot go on after one): it panics with a fatal, which the
// writer recovers from as an error; from any other goroutine it ends the
// process, as Pebble expects.
func (l pebbleLog) Fatalf(format string, args ...any) {
	f := fatal{msg: fmt.Sprintf(format, args...)}
	for _, a := range args {
		if err, ok := a.(error); ok {
			f.err = err
		}
	}
	panic(f)
}

type fatal struct {
	msg string
	err error // the cause among Fatalf's arguments, if any
}

func openWriter(ctx context.Context, path string, opt Options, s *Store) (*writer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := time.Now()
	if fi, err := os.Stat(path); err == nil && !fi.IsDir() {
		return nil, fmt.Errorf("open disk store %s: it is a file; the disk store keeps a directory there (give a new path, or remove the file)", path)
	}
	if err := checkFolder(path); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("open disk store %s: %w", path, err)
	}
	if err := checkWritable(path); err != nil {
		return nil, err
	}
	lock, err := lockDir(ctx, path)
	if err != nil {
		return nil, err
	}
	o := &pebble.Options{
		Lock:   lock,
		Logger: pebbleLog{opt.Logger, newErrorLimit(opt.now)},
		// A corrupt file is reported here and then returned as an error by
		// the read that found it; by default Pebble ends the process.
		EventListener: &pebble.EventListener{DataCorruption: func(info pebble.DataCorruptionInfo) {
			opt.Logger.Error("disk store: corrupt file", "path", info.Path, "err", info.Details)
		}},
		FS:                 opt.fs,
		FormatMajorVersion: pebble.FormatNewest, // Excise needs virtual tables
		// Small memtables: Pebble reuses a memtable's memory and its WAL
		// file once their size stops doubling (from 256 KB); fresh ones
		// cost a page fault per 4 KB written and a WAL whose every
		// fdatasync also commits its growing size, and a large memtable
		// keeps a young store in that state for long; 4 MiB also bounds
		// the WAL an open replays.
		MemTableSize: 4 << 20,
	}
	o.ApplyCompressionSettings(func() pebble.DBCompressionSettings { return pebble.DBCompressionNone })
	db, err := pebble.Open(path, o)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("open disk store %s: %w", path, advise(err))
	}
	w := &writer{
		s: s, path: path, db: db, log: opt.Logger, every: opt.SweepEvery,
		wo:   pebble.Sync,
		cur:  newGroup(),
		wake: make(chan struct{}, 1), stop: make(chan struct{}), exited: make(chan struct{}),
		lastExcise: time.Now(),
	}
	if opt.NoSync {
		w.wo = pebble.NoSync
	}
	fail := func(err error) (*writer, error) {
		db.Close()
		lock.Close()
		return nil, fmt.Errorf("open disk store %s: %w", path, advise(err))
	}
	if err := w.init(); err != nil {
		return fail(err)
	}
	n, err := w.load(ctx)
	if err != nil {
		return fail(err)
	}
	w.lock = lock
	w.log.Info("disk store opened", "path", path, "keys", n, "took", time.Since(start).Round(time.Millisecond))
	go w.loop()
	return w, nil
}

// init writes the version of a new store and checks that of an old one,
// so a future layout is refused instead of misread.
func (w *writer) init() error {
	v, closer, err := w.db.Get(keyVersion)
	if errors.Is(err, pebble.ErrNotFound) {
		return w.db.Set(keyVersion, binary.BigEndian.AppendUint32(nil, formatVersion), pebble.Sync)
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) != 4 || binary.BigEndian.Uint32(v) != formatVersion {
		return fmt.Errorf("unsupported database format %x (want %d)", v, formatVersion)
	}
	return nil
}

// load rebuilds the index from the database. Inserting records straight
// into the tables in the database's order would touch a random spot of
// hundreds of megabytes per key, a cache and TLB miss each; instead a chunk
// of records is split by shard into flat slices (sequential writes), then
// every shard's table takes its slice, within a megabyte or two. Two
// goroutines index a chunk, half the shards each, while the iterator fills
// the other buffer. The buffers are reused, since fresh pages cost a fault
// each. A key committed twice keeps its later expiry, as Commit keeps it.
func (w *writer) load(ctx context.Context) (int, error) {
	const (
		nshards = 1 << shardBits
		chunk   = 1 << 20 // records per chunk: 40 MiB per buffer with its spare quarter
	)
	start := time.Now()
	var bufs [2][nshards][]loadRec
	var indexer sync.WaitGroup
	index := func(parts *[nshards][]loadRec) {
		indexer.Wait()
		for half := range 2 { // shards are independent: both cores
			indexer.Go(func() {
				for i := half * nshards / 2; i < (half+1)*nshards/2; i++ {
					t := w.s.set.Shard(i) // not shared yet: no lock
					for _, r := range parts[i] {
						t.Commit(r.k, r.tag, r.exp)
					}
					parts[i] = parts[i][:0]
				}
			})
		}
	}
	it, err := w.db.NewIter(&pebble.IterOptions{LowerBound: groupsLow, UpperBound: groupsEnd})
	if err != nil {
		return 0, err
	}
	defer it.Close()
	// Count first (one step per group, not per record) to size the
	// tables once rather than grow them ten million keys long.
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != groupKeyLen || len(v)%recLen != 0 {
			return 0, fmt.Errorf("%w: group %x (%d bytes)", pebble.ErrCorruption, k, len(v))
		}
		n += len(v) / recLen
		w.seq = max(w.seq, binary.BigEndian.Uint64(k[8:]))
	}
	if err := it.Error(); err != nil {
		return 0, err
	}
	w.s.set = table.NewSet(shardBits, n+n/16)
	// Buffers as large as the database needs, up to a chunk: a small
	// store must not start with a chunk's worth of memory.
	size := min(n, chunk)
	for i := range min(2, 1+n/chunk) {
		for j := range bufs[i] {
			bufs[i][j] = make([]loadRec, 0, size/nshards+size/nshards/4+1)
		}
	}
	cur, inChunk := 0, 0
	parts := &bufs[cur]
	for ok := it.First(); ok; ok = it.Next() {
		v := it.Value()
		inChunk += len(v) / recLen
		for ; len(v) > 0; v = v[recLen:] {
			key, r := getRec(v)
			i := w.s.set.ShardOf(key)
			parts[i] = append(parts[i], loadRec{key, r})
		}
		if inChunk >= chunk {
			if err := ctx.Err(); err != nil {
				indexer.Wait()
				return 0, err
			}
			index(parts)
			cur, inChunk = 1-cur, 0
			parts = &bufs[cur]
		}
	}
	index(parts)
	indexer.Wait()
	if err := it.Error(); err != nil {
		return 0, err
	}
	w.log.Debug("disk store index loaded", "keys", n, "took", time.Since(start).Round(time.Millisecond))
	return n, nil
}

type loadRec struct {
	k dedup.Key
	rec
}

// put queues one commit and waits until its group is durable. The
// one-element slices do not escape (putMany copies them), so they cost no
// allocation.
func (w *writer) put(ctx context.Context, k dedup.Key, r rec) error {
	return w.putMany(ctx, []dedup.Key{k}, []rec{r})
}

// putMany queues the commits of keys[i] as recs[i], all in one group, and
// waits until it is durable.
func (w *writer) putMany(ctx context.Context, keys []dedup.Key, recs []rec) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return ErrClosed
	}
	if w.failed != nil {
		w.mu.Unlock()
		return w.failed
	}
	g := w.cur
	first := len(g.keys) == 0
	g.keys = append(g.keys, keys...)
	g.recs = append(g.recs, recs...)
	w.mu.Unlock()
	return w.wait(ctx, g, first)
}

// wait waits until g is durable; first (g was empty before this caller's
// commits) wakes the writer.
func (w *writer) wait(ctx context.Context, g *group, first bool) error {
	if first {
		// Only the first commit of a group wakes the writer: the ones
		// after it go with it, or into the group the writer takes next.
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	done := ctx.Done()
	if done == nil {
		<-g.done // a plain receive: select costs more, per commit
		return g.err
	}
	select {
	case <-g.done:
		return g.err
	case <-done:
		// The write may still land; that is harmless, the sink has it.
		return ctx.Err()
	}
}

func (w *writer) take() *group {
	next := newGroup()
	next.keys, next.recs = w.spareKeys[:0], w.spareRecs[:0]
	w.spareKeys, w.spareRecs = nil, nil
	w.mu.Lock()
	g := w.cur
	w.cur = next
	w.mu.Unlock()
	return g
}

// loop is the writer goroutine. While one batch syncs, commits pile up in
// the next group: that is the whole group-commit mechanism, with no timer
// to tune.
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
		now := w.s.set.Now()
		if tick {
			w.s.set.Sweep(walkSlots, now)
		}
		g := w.take()
		more := w.write(g, now)
		if stopping {
			return
		}
		if tick {
			if err := w.excise(false); err != nil {
				w.log.Error("cutting swept groups from the database failed", "err", err)
			}
		}
		if more {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
	}
}

// write commits a group as one entry in one batch: one Set of one
// contiguous value, however many commits share it. Then it sweeps up to
// twice as many expired records as it added, so the database shrinks as
// fast as it grows. It reports whether expired groups remain.
func (w *writer) write(g *group, now int64) (more bool) {
	w.txMu.Lock()
	defer w.txMu.Unlock()
	if len(g.keys) > 0 {
		g.err = w.commit(g)
		if g.err != nil {
			// Pebble cannot go on after a write it could not make (a full
			// or read-only disk, a directory that is gone, an I/O error):
			// only reopening the database, which a restart does, heals it.
			g.err = fmt.Errorf("disk store %s: %w: %w", w.path, dedup.ErrFatal, g.err)
			w.mu.Lock()
			w.failed = g.err
			w.mu.Unlock()
		}
	}
	close(g.done)
	w.spareKeys, w.spareRecs = g.keys, g.recs // no one reads them now
	if g.err != nil {
		return false
	}
	limit := 2*len(g.keys) + 256
	if len(g.keys) == 0 {
		limit = idleSweep
	}
	swept, more, err := w.sweep(now, limit)
	if err != nil {
		w.log.Error("sweeping the database failed", "err", err)
		return false
	}
	if swept > 0 {
		w.log.Debug("swept expired keys", "n", swept)
	}
	return more
}

func (w *writer) commit(g *group) (err error) {
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fatal)
			if !ok {
				panic(r)
			}
			err = f.err
			if err == nil {
				err = errors.New(f.msg)
			}
		}
	}()
	var maxExp int64
	for _, r := range g.recs {
		maxExp = max(maxExp, r.exp)
	}
	// A group that expired before the sweep's position (its keys were
	// committed past their horizon) goes at that position, where the
	// next sweep finds it.
	if w.swept != nil {
		maxExp = max(maxExp, groupExp(w.swept))
	}
	w.seq++
	b := w.db.NewBatch()
	defer b.Close()
	op := b.SetDeferred(groupKeyLen, len(g.keys)*recLen)
	groupKey(op.Key, maxExp, w.seq)
	for i, k := range g.keys {
		putRec(op.Value[i*recLen:], k, g.recs[i])
	}
	if err := op.Finish(); err != nil {
		return err
	}
	if err := b.Commit(w.wo); err != nil {
		return err
	}
	w.nextExp = min(w.nextExp, maxExp)
	w.txs.Add(1)
	w.keys.Add(int64(len(g.keys)))
	return nil
}

func (w *writer) close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	close(w.stop)
	<-w.exited
	// A clean stop leaves no swept groups for the next open to read.
	err := w.excise(true)
	err = errors.Join(err, w.db.Close())
	if err = errors.Join(err, w.lock.Close()); err != nil {
		return fmt.Errorf("close disk store %s: %w", w.path, err)
	}
	return nil
}
