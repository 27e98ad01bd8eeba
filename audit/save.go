package audit

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
)

// The saved filter's format, little-endian:
//
//	magic "DFAUDIT1"
//	header: width ns (int64), generations (uint32), m bits (uint64),
//	        k (uint32), newest epoch (int64), started (uint8)
//	per generation: epoch (int64), keys (uint64), m/64 words (uint64 each)
//	CRC-32C of everything before it (uint32)
//
// The filters' words are written as they are in memory, a generation at a
// time, so a saved filter holds one generation's copy beyond the filter itself
// and the lock is held only while that copy is made.
const magic = "DFAUDIT1"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// WriteTo saves f to w.
func (f *Filter) WriteTo(w io.Writer) (int64, error) {
	cw := &countWriter{w: w, crc: crc32.New(crcTable)}
	bw := bufio.NewWriterSize(cw, 1<<16)
	f.mu.RLock()
	hdr := make([]byte, 0, 64)
	hdr = append(hdr, magic...)
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(f.width))
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(f.gens)-1))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(f.m))
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(f.k))
	hdr = binary.LittleEndian.AppendUint64(hdr, uint64(f.cur))
	hdr = append(hdr, b2u(f.ok))
	f.mu.RUnlock()
	if _, err := bw.Write(hdr); err != nil {
		return cw.n, fmt.Errorf("save audit filter: %w", err)
	}
	words := make([]uint64, f.m/64)
	buf := make([]byte, 0, 16)
	for i := range f.gens {
		f.mu.RLock()
		g := &f.gens[i]
		epoch, n := g.epoch, g.n
		copy(words, g.f.BitSet().Words())
		f.mu.RUnlock()
		buf = binary.LittleEndian.AppendUint64(buf[:0], uint64(epoch))
		buf = binary.LittleEndian.AppendUint64(buf, uint64(n))
		if _, err := bw.Write(buf); err != nil {
			return cw.n, fmt.Errorf("save audit filter: %w", err)
		}
		if err := writeWords(bw, words); err != nil {
			return cw.n, fmt.Errorf("save audit filter: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return cw.n, fmt.Errorf("save audit filter: %w", err)
	}
	if _, err := w.Write(binary.LittleEndian.AppendUint32(nil, cw.crc.Sum32())); err != nil {
		return cw.n, fmt.Errorf("save audit filter: %w", err)
	}
	return cw.n + 4, nil
}

// ReadFrom replaces f's contents with the filter saved in r. A filter saved
// with other options (horizon, generations, capacity or rate) is refused
// with ErrMismatch and f is left as it was; so is a damaged one.
func (f *Filter) ReadFrom(r io.Reader) (int64, error) {
	crc := crc32.New(crcTable)
	cr := &countReader{r: bufio.NewReaderSize(r, 1<<16)}
	tr := io.TeeReader(cr, crc)
	hdr := make([]byte, len(magic)+8+4+8+4+8+1)
	if _, err := io.ReadFull(tr, hdr); err != nil {
		return cr.n, fmt.Errorf("read saved audit filter header: %w", err)
	}
	if string(hdr[:len(magic)]) != magic {
		return cr.n, errors.New("read saved audit filter: not a saved audit filter")
	}
	h := hdr[len(magic):]
	width, gens := int64(binary.LittleEndian.Uint64(h)), int(binary.LittleEndian.Uint32(h[8:]))
	m, k := uint(binary.LittleEndian.Uint64(h[12:])), uint(binary.LittleEndian.Uint32(h[20:]))
	cur, ok := int64(binary.LittleEndian.Uint64(h[24:])), h[32] == 1
	if width != f.width || gens != len(f.gens)-1 || m != f.m || k != f.k {
		return cr.n, fmt.Errorf("%w: the saved filter has %d generations of %v, %d bits, %d hashes; want %d of %v, %d bits, %d hashes",
			ErrMismatch, gens, time.Duration(width), m, k, len(f.gens)-1, time.Duration(f.width), f.m, f.k)
	}
	// Read into fresh filters first, so a damaged file changes nothing.
	loaded := make([]gen, len(f.gens))
	buf := make([]byte, 16)
	for i := range loaded {
		if _, err := io.ReadFull(tr, buf); err != nil {
			return cr.n, fmt.Errorf("read saved audit filter: %w", err)
		}
		words := make([]uint64, m/64)
		if err := readWords(tr, words); err != nil {
			return cr.n, fmt.Errorf("read saved audit filter: %w", err)
		}
		loaded[i] = gen{
			epoch: int64(binary.LittleEndian.Uint64(buf)),
			n:     uint(binary.LittleEndian.Uint64(buf[8:])),
			f:     bloom.FromWithM(words, m, k),
		}
		if ok && loaded[i].epoch > cur {
			cur = loaded[i].epoch // rotated while the filter was saved
		}
	}
	sum := crc.Sum32()
	var tail [4]byte
	if _, err := io.ReadFull(cr, tail[:]); err != nil {
		return cr.n, fmt.Errorf("read saved audit filter checksum: %w", err)
	}
	if binary.LittleEndian.Uint32(tail[:]) != sum {
		return cr.n, errors.New("read saved audit filter: checksum mismatch (damaged file)")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := range loaded {
		// Each generation lands in the slot its epoch maps to now.
		e := loaded[i].epoch
		if e == noEpoch {
			continue
		}
		*f.slot(e) = loaded[i]
	}
	if ok && (!f.ok || cur > f.cur) {
		f.cur, f.ok = cur, true
	}
	return cr.n, nil
}

// SaveFile saves f to path atomically: a temporary file in the
// same directory, fsynced, renamed over path, and the directory fsynced,
// so a crash leaves the old file or the new one, never half of one.
func (f *Filter) SaveFile(path string) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("save audit filter: %w", err)
	}
	defer os.Remove(tmp.Name()) // a no-op once renamed
	if _, err := f.WriteTo(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("save audit filter: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("save audit filter: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("save audit filter: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("save audit filter: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("save audit filter: sync directory: %w", err)
	}
	return nil
}

// LoadFile reads the filter saved at path into f. A missing file is not an
// error (a first start): it returns false.
func (f *Filter) LoadFile(path string) (bool, error) {
	file, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("load saved audit filter: %w", err)
	}
	defer file.Close()
	if _, err := f.ReadFrom(file); err != nil {
		return false, fmt.Errorf("load saved audit filter %s: %w", path, err)
	}
	return true, nil
}

// Target keeps a Filter's state somewhere it survives a restart.
type Target interface {
	// Load brings the saved state into f, and reports whether there was
	// any.
	Load(ctx context.Context, f *Filter) (bool, error)
	// Save stores f's state.
	Save(ctx context.Context, f *Filter) error
	// String names the target in logs.
	String() string
}

// File is a Target: a file, replaced atomically on every save.
type File string

// Load implements Target.
func (p File) Load(_ context.Context, f *Filter) (bool, error) { return f.LoadFile(string(p)) }

// Save implements Target.
func (p File) Save(_ context.Context, f *Filter) error { return f.SaveFile(string(p)) }

func (p File) String() string { return string(p) }

// Saver saves a Filter to a Target periodically and once more when
// stopped. Start it with StartSaving; Stop it before the process exits.
type Saver struct {
	f      *Filter
	to     Target
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// StartSaving loads the target into f (a damaged or mismatched saved filter
// is logged and f starts empty: the audit is advisory and must not stop
// the pipeline), then saves f to it every `every` until Stop.
func StartSaving(ctx context.Context, f *Filter, to Target, every time.Duration, log *slog.Logger) *Saver {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("audit_file", to.String())
	switch found, err := to.Load(ctx, f); {
	case err != nil:
		log.Warn("saved audit filter not loaded; the audit starts empty", "err", err)
	case found:
		st := f.Stats()
		log.Info("saved audit filter loaded", "keys", st.Keys)
	}
	// Saves outlive the caller's cancellation: the last one runs after it.
	base := context.WithoutCancel(ctx)
	loopCtx, cancel := context.WithCancel(base)
	s := &Saver{f: f, to: to, log: log, ctx: base, cancel: cancel, done: make(chan struct{})}
	go s.loop(loopCtx, every)
	return s
}

func (s *Saver) loop(ctx context.Context, every time.Duration) {
	defer close(s.done)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.save()
		}
	}
}

func (s *Saver) save() {
	start := time.Now()
	ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
	defer cancel()
	if err := s.to.Save(ctx, s.f); err != nil {
		s.log.Warn("saved audit filter not saved", "err", err)
		return
	}
	s.log.Debug("saved audit filter saved", "took", time.Since(start))
}

// Stop ends the periodic saves, waits for a save in progress, and saves
// once more, so what was added up to now survives a restart.
func (s *Saver) Stop() {
	s.once.Do(func() {
		s.cancel()
		<-s.done
		s.save()
	})
}

type countWriter struct {
	w   io.Writer
	crc hash.Hash32
	n   int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.crc.Write(p[:n])
	c.n += int64(n)
	return n, err
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func writeWords(w io.Writer, words []uint64) error {
	var buf [8 * 512]byte
	for len(words) > 0 {
		n := min(len(words), 512)
		for i, x := range words[:n] {
			binary.LittleEndian.PutUint64(buf[8*i:], x)
		}
		if _, err := w.Write(buf[:8*n]); err != nil {
			return err
		}
		words = words[n:]
	}
	return nil
}

func readWords(r io.Reader, words []uint64) error {
	var buf [8 * 512]byte
	for len(words) > 0 {
		n := min(len(words), 512)
		if _, err := io.ReadFull(r, buf[:8*n]); err != nil {
			return err
		}
		for i := range words[:n] {
			words[i] = binary.LittleEndian.Uint64(buf[8*i:])
		}
		words = words[n:]
	}
	return nil
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}
