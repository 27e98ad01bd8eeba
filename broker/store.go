package broker

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"
)

const logName = "broker.log"

// openStore takes the data directory and replays its log into memory. The
// log is not rewritten first: it is cut at its last intact record (a torn
// tail from a crash was never acknowledged) and appended to, so a start
// costs one read of the log; the compactor rewrites it later, in the
// background, once it has grown to twice the live state.
func (b *Broker) openStore() error {
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
		b.wal = newWAL(nil, 0, b.opts.NoSync, b.log)
		if err := b.compactLocked(); err != nil { // an empty, synced log
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
		b.wal = newWAL(f, end, b.opts.NoSync, b.log)
		b.wal.compactAt = max(minCompactSize, 2*live)
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
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	var hdr [8]byte
	var p []byte // reused: records copy what they keep
	records := 0
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if !errors.Is(err, io.EOF) {
				b.log.Warn("log ends with a torn record header; ignoring it", "offset", off)
			}
			break
		}
		n := binary.LittleEndian.Uint32(hdr[:4])
		if n == 0 || n > maxRecordLen {
			b.log.Warn("log has an invalid record length; ignoring the rest", "offset", off, "length", n)
			break
		}
		if cap(p) < int(n) {
			p = make([]byte, n)
		}
		p = p[:n]
		if _, err := io.ReadFull(r, p); err != nil {
			b.log.Warn("log ends with a torn record; ignoring it", "offset", off)
			break
		}
		if crc32.Checksum(p, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
			b.log.Warn("log record fails its checksum; ignoring the rest", "offset", off)
			break
		}
		if err := b.applyRecord(p); err != nil {
			return 0, 0, fmt.Errorf("broker: replay log at offset %d: %w", off, err)
		}
		off += 8 + int64(n)
		records++
	}
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

// compactLocked writes the current state as a new log and swaps it in
// atomically (write, fsync, rename, fsync the directory). Records that were
// appended but not yet written are already part of the state, so they are
// dropped from the buffer and their waiters released. It runs with b.mu
// held, so nothing changes meanwhile; its cost is proportional to the live
// state, and the next one waits until the log has doubled.
func (b *Broker) compactLocked() error {
	w := b.wal
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	dir := b.opts.DataDir
	path := filepath.Join(dir, logName)
	f, err := os.OpenFile(path+".tmp", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("broker: create checkpoint: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	var size int64
	var frame []byte
	err = b.checkpoint(func(typ byte, enc func([]byte) []byte) error {
		frame = append(frame[:0], 0, 0, 0, 0, 0, 0, 0, 0, typ)
		frame = enc(frame)
		binary.LittleEndian.PutUint32(frame[0:], uint32(len(frame)-8))
		binary.LittleEndian.PutUint32(frame[4:], crc32.Checksum(frame[8:], crcTable))
		size += int64(len(frame))
		_, err := bw.Write(frame)
		return err
	})
	if err == nil {
		err = bw.Flush()
	}
	if err == nil {
		// Always synced, even with NoSync: this file replaces the old log.
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(path+".tmp", path)
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		f.Close()
		return fmt.Errorf("broker: write checkpoint: %w", err)
	}
	if w.f != nil {
		w.f.Close()
	}
	w.f, w.size = f, size
	w.compactAt = max(minCompactSize, 2*size)
	w.mu.Lock()
	w.buf = w.buf[:0]
	w.gen++
	w.durable = w.appended
	close(w.done)
	w.done = make(chan struct{})
	w.mu.Unlock()
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
		b.mu.Lock()
		err := b.compactLocked()
		size := b.wal.size
		b.mu.Unlock()
		if err != nil {
			b.log.Error("log compaction failed; the log keeps growing", "err", err)
			continue
		}
		b.log.Debug("log compacted", "bytes", size, "took", time.Since(start))
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
