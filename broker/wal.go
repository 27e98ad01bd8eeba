package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"

	"github.com/dedupflow/dedupflow/broker/internal/logframe"
)

// errClosed is returned to callers still waiting for durability when the
// broker shuts down.
var errClosed = errors.New("broker: closed")

// defaultCompactSize is the smallest log that is worth compacting, unless
// Options.CompactSize says otherwise.
const defaultCompactSize = 64 << 20

// wal is the append-only log. Records are appended to an in-memory buffer
// (under the broker's lock, so log order is state order); one goroutine
// writes the buffer and fsyncs it, and everybody whose record was in that
// write is released at once. That is group commit: with many concurrent
// publishers one fsync covers hundreds of requests, so durability costs
// latency, not throughput.
//
// Framing (package logframe): 4-byte little-endian payload length, 4-byte
// CRC-32C of the payload, payload. A torn or corrupt tail (a crash in the middle of a write)
// ends replay there and is truncated away.
type wal struct {
	noSync bool
	log    *slog.Logger

	mu       sync.Mutex
	buf      []byte // appended, not yet handed to the writer
	appended uint64 // logical offset after the last appended record
	durable  uint64 // logical offset known to be written (and synced)
	done     chan struct{}
	err      error // sticky write error: the broker cannot promise durability any more
	closed   bool
	kick     chan struct{}
	// gen counts compactions. A batch taken before a compaction is already
	// part of the checkpoint that replaced the file and must not be written.
	gen uint64

	// writeMu is held while writing to f, so that compaction can swap the
	// file between two writes.
	writeMu sync.Mutex
	f       *os.File
	size    int64 // bytes in f

	// tail keeps a copy of every record appended while a compaction writes
	// its checkpoint (tailing), to follow the checkpoint in the new file.
	tailing bool
	tail    []byte

	// compactAt is the file size that asks for a compaction on compact;
	// it is never below minCompact.
	compactAt  int64
	minCompact int64
	compact    chan struct{}
}

func newWAL(f *os.File, size int64, noSync bool, minCompact int64, log *slog.Logger) *wal {
	return &wal{
		noSync: noSync, log: log, f: f, size: size, compactAt: minCompact, minCompact: minCompact,
		done: make(chan struct{}), kick: make(chan struct{}, 1), compact: make(chan struct{}, 1),
	}
}

// finish completes the frame that starts at w.buf[start:] (begun with
// logframe.Begin) and hands it to the writer; w.mu is held.
func (w *wal) finish(start int) {
	logframe.Finish(w.buf[start:])
	w.appended += uint64(len(w.buf) - start)
	if w.tailing {
		w.tail = append(w.tail, w.buf[start:]...)
	}
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// offset is the end of everything appended so far: waiting for it makes all
// of the caller's records durable.
func (w *wal) offset() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.appended
}

// wait blocks until the log is durable up to off.
func (w *wal) wait(ctx context.Context, off uint64) error {
	for {
		w.mu.Lock()
		if w.durable >= off {
			w.mu.Unlock()
			return nil
		}
		if w.err != nil {
			err := w.err
			w.mu.Unlock()
			return err
		}
		done := w.done
		w.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
			return fmt.Errorf("wait for log write: %w", ctx.Err())
		}
	}
}

// run is the writer loop; it returns after close once everything appended
// has been written.
func (w *wal) run() {
	var spare []byte
	for {
		w.mu.Lock()
		for len(w.buf) == 0 && !w.closed {
			w.mu.Unlock()
			<-w.kick
			w.mu.Lock()
		}
		if len(w.buf) == 0 && w.closed {
			w.mu.Unlock()
			return
		}
		batch := w.buf
		w.buf = spare[:0]
		target, gen := w.appended, w.gen
		w.mu.Unlock()

		err := w.write(batch, gen)
		spare = batch

		w.mu.Lock()
		if err != nil && w.err == nil {
			// Sticky: after a failed write or fsync nothing later can be
			// promised durable, so every later wait fails (clients see
			// Unavailable) until the broker is restarted.
			w.err = fmt.Errorf("broker: write log: %w", err)
			w.log.Error("log write failed; publishes are refused as not durable until restart", "err", err)
		}
		if err == nil && target > w.durable {
			w.durable = target
		}
		close(w.done)
		w.done = make(chan struct{})
		w.mu.Unlock()
	}
}

func (w *wal) write(p []byte, gen uint64) error {
	w.writeMu.Lock()
	defer w.writeMu.Unlock()
	w.mu.Lock()
	stale := gen != w.gen
	w.mu.Unlock()
	if stale {
		return nil
	}
	if _, err := w.f.Write(p); err != nil {
		return err
	}
	w.size += int64(len(p))
	if w.size > w.compactAt {
		select {
		case w.compact <- struct{}{}:
		default:
		}
	}
	if w.noSync {
		return nil
	}
	return w.f.Sync()
}

// close stops the writer after it has flushed; the caller waits for run to
// return before closing the file.
func (w *wal) close() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// fail releases waiters with err; used when the writer is gone.
func (w *wal) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	close(w.done)
	w.done = make(chan struct{})
	w.mu.Unlock()
}
