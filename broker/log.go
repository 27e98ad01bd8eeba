package broker

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/dedupflow/dedupflow/broker/internal/logframe"
)

const logName = "broker.log"

// openStore takes the data directory and replays its log into memory. The
// log is not rewritten first: it is cut at its last intact record (a torn
// tail from a crash was never acknowledged) and appended to, so a start
// costs one read of the log; the compactor rewrites it later, in the
// background, once it has grown to twice the live state.
func (b *Broker) openLog() error {
	dir := b.opts.DataDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("broker: create data dir: %w", err)
	}
	lock, err := lockDir(dir)
	if err != nil {
		return err
	}
	b.dirLock = lock
	path := filepath.Join(dir, logName)
	if err := os.Remove(path + ".tmp"); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("broker: remove stale checkpoint: %w", err)
	}
	start := time.Now()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := b.createLog(path); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("broker: open log: %w", err)
	default:
		end, live, err := b.replay(f)
		if err == nil {
			err = cutLog(f, end)
		}
		if err != nil {
			f.Close()
			return err
		}
		b.wal = newWAL(f, end, b.opts.NoSync, b.opts.CompactSize, b.log)
		b.wal.compactAt = max(b.wal.minCompact, 2*live)
	}
	held := 0
	for _, s := range b.subByID {
		held += s.held
	}
	b.log.Info("broker state loaded", "data_dir", dir, "topics", len(b.topicByID),
		"subscriptions", len(b.subByID), "unacked_deliveries", held, "took", time.Since(start))
	return nil
}

// cutLog drops whatever follows the last intact record and leaves f
// positioned for appending there.
func cutLog(f *os.File, end int64) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("broker: stat log: %w", err)
	}
	if fi.Size() > end {
		if err := f.Truncate(end); err != nil {
			return fmt.Errorf("broker: cut torn log tail: %w", err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("broker: cut torn log tail: %w", err)
		}
	}
	if _, err := f.Seek(end, io.SeekStart); err != nil {
		return fmt.Errorf("broker: seek log end: %w", err)
	}
	return nil
}

// replay applies every intact record of the log and returns where the
// intact part ends and about how many bytes a checkpoint of the resulting
// state takes. A torn or corrupt record (a crash mid-write) ends the log
// there: everything after it was never acknowledged to a client as
// durable, because records become durable in order.
func (b *Broker) replay(f *os.File) (end, live int64, err error) {
	b.replaying = true
	defer func() { b.replaying = false }()
	sc := logframe.NewScanner(f)
	records := 0
	for {
		off := sc.Offset()
		p, ok := sc.Next() // reused: records copy what they keep
		if !ok {
			break
		}
		if err := b.applyRecord(p); err != nil {
			return 0, 0, fmt.Errorf("broker: replay log at offset %d: %w", off, err)
		}
		records++
	}
	if err := sc.Err(); err != nil {
		return 0, 0, fmt.Errorf("broker: read log: %w", err)
	}
	if err := sc.Torn(); err != nil {
		b.log.Warn("log ends with a torn or corrupt record, never acknowledged; ignoring it and what follows", "err", err)
	}
	off := sc.Offset()
	for _, s := range sortedByID(b.subByID) {
		msgs := s.replay.held()
		s.replay = nil
		s.held = 0
		s.ready.reserve(len(msgs))
		for _, m := range msgs {
			s.held++
			s.enqueueLocked(item{m: m}, false)
			live += int64(len(m.body)+len(m.key)) + 32 // its record in a checkpoint, about
		}
	}
	b.log.Debug("log replayed", "records", records, "bytes", off)
	return off, live, nil
}

// compact writes the current state as a new log and swaps it in
// atomically (write, fsync, rename, fsync the directory) without stopping
// the broker: the state is captured under b.mu (pointers to the immutable
// messages, the configuration records), the checkpoint is encoded and
// written outside it, and records appended meanwhile are kept aside by the
// log and copied after the checkpoint. Only that copy's last piece, the
// swap and their fsync hold the log's lock.
func (b *Broker) compact() error {
	w := b.wal
	path := filepath.Join(b.opts.DataDir, logName)
	b.mu.Lock()
	w.mu.Lock()
	w.tailing, w.tail = true, nil
	w.mu.Unlock()
	cp := b.captureLocked()
	b.mu.Unlock()
	stopTail := func() {
		w.mu.Lock()
		w.tailing, w.tail = false, nil
		w.mu.Unlock()
	}

	f, err := os.OpenFile(path+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		stopTail()
		return fmt.Errorf("broker: create checkpoint: %w", err)
	}
	fail := func(err error) error {
		stopTail()
		f.Close()
		os.Remove(path + ".tmp")
		return fmt.Errorf("broker: write checkpoint: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	size, err := cp.write(bw, b.closing)
	if err == nil {
		err = bw.Flush()
	}
	for err == nil { // what was appended meanwhile, while it is large
		w.mu.Lock()
		chunk := w.tail
		if len(chunk) < 1<<20 {
			w.mu.Unlock()
			break
		}
		w.tail = nil
		w.mu.Unlock()
		_, err = f.Write(chunk)
		size += int64(len(chunk))
	}
	if err == nil {
		// Always synced, even with NoSync: this file replaces the old log.
		err = f.Sync()
	}
	if err != nil {
		return fail(err)
	}

	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	_, err = f.Write(w.tail)
	size += int64(len(w.tail))
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err != nil {
		w.tailing, w.tail = false, nil
		f.Close()
		os.Remove(path + ".tmp")
		return fmt.Errorf("broker: write checkpoint: %w", err)
	}
	// Renamed: from here on the new file is the log, whatever else fails.
	w.f.Close()
	w.f, w.size = f, size
	w.compactAt = max(w.minCompact, 2*(size-int64(len(w.tail))))
	// Everything appended so far is in the new file; a batch the writer
	// took meanwhile belongs to the old one and is not written again.
	w.tailing, w.tail = false, nil
	w.buf = w.buf[:0]
	w.gen++
	err = syncDir(b.opts.DataDir)
	if err == nil {
		w.durable = w.appended
	} else if w.err == nil {
		// The rename may not survive a power loss, so what only the new
		// file holds cannot be promised (sticky, as a failed write).
		w.err = fmt.Errorf("broker: sync data dir after checkpoint: %w", err)
	}
	close(w.done)
	w.done = make(chan struct{})
	return err
}

// createLog starts an empty data directory with an empty, synced log.
func (b *Broker) createLog(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err == nil {
		err = syncDir(b.opts.DataDir)
	}
	if err != nil {
		if f != nil {
			f.Close()
		}
		return fmt.Errorf("broker: create log: %w", err)
	}
	b.wal = newWAL(f, 0, b.opts.NoSync, b.opts.CompactSize, b.log)
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// runCompactor compacts the log whenever the writer reports it has grown.
func (b *Broker) runCompactor() {
	defer b.wg.Done()
	for {
		select {
		case <-b.closing:
			return
		case <-b.wal.compact:
		}
		start := time.Now()
		err := b.compact()
		if errors.Is(err, errClosed) {
			return
		}
		if err != nil {
			b.log.Error("log compaction failed; the log keeps growing", "err", err)
			continue
		}
		select { // a request the writer made while this compaction ran
		case <-b.wal.compact:
		default:
		}
		b.log.Debug("log compacted", "took", time.Since(start))
	}
}

func sortedByID[T any](m map[uint64]T) []T {
	out := make([]T, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

func sortedKeys[T any](m map[uint64]T) []uint64 {
	return slices.Sorted(maps.Keys(m))
}
