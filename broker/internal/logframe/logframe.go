// Package logframe is the broker log's framing and field encoding, without
// the broker: a frame is a 4-byte little-endian payload length, a 4-byte
// CRC-32C of the payload, and the payload; a payload is a sequence of
// uvarints, varints and length-prefixed bytes. A torn or corrupt frame (a
// crash in the middle of a write) ends a log: Scanner stops there and says
// where the intact part ends.
package logframe

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
)

// MaxLen bounds a payload; a longer length field is taken for corruption.
const MaxLen = 64 << 20

// HeaderLen is the size of a frame's header.
const HeaderLen = 8

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Begin reserves a frame header at the end of dst; the caller appends the
// payload and then calls Finish on dst[start:], start being len(dst)
// before Begin.
func Begin(dst []byte) []byte { return append(dst, 0, 0, 0, 0, 0, 0, 0, 0) }

// Finish fills in the header of frame, a header and its payload.
func Finish(frame []byte) {
	payload := frame[HeaderLen:]
	binary.LittleEndian.PutUint32(frame, uint32(len(payload)))
	binary.LittleEndian.PutUint32(frame[4:], crc32.Checksum(payload, crcTable))
}

// Append appends one frame whose payload enc appends.
func Append(dst []byte, enc func([]byte) []byte) []byte {
	start := len(dst)
	dst = enc(Begin(dst))
	Finish(dst[start:])
	return dst
}

// Scanner reads the frames of a log in order.
type Scanner struct {
	r    *bufio.Reader
	off  int64
	p    []byte
	torn error
	err  error
}

// NewScanner reads frames from r.
func NewScanner(r io.Reader) *Scanner {
	return &Scanner{r: bufio.NewReaderSize(r, 1<<20)}
}

// ErrTorn says that the log ends with a frame that is cut short or fails
// its checksum; what follows the last intact frame was never completely
// written.
var ErrTorn = errors.New("torn or corrupt frame")

// Next returns the next intact payload, valid until the following call, or
// false at the end of the intact part of the log (see Torn and Err).
func (s *Scanner) Next() ([]byte, bool) {
	if s.torn != nil || s.err != nil {
		return nil, false
	}
	var hdr [HeaderLen]byte
	if _, err := io.ReadFull(s.r, hdr[:]); err != nil {
		switch {
		case errors.Is(err, io.EOF):
		case errors.Is(err, io.ErrUnexpectedEOF):
			s.torn = fmt.Errorf("%w: header cut short at offset %d", ErrTorn, s.off)
		default:
			s.err = err
		}
		return nil, false
	}
	n := binary.LittleEndian.Uint32(hdr[:4])
	if n == 0 || n > MaxLen {
		s.torn = fmt.Errorf("%w: invalid length %d at offset %d", ErrTorn, n, s.off)
		return nil, false
	}
	if cap(s.p) < int(n) {
		s.p = make([]byte, n)
	}
	s.p = s.p[:n]
	if _, err := io.ReadFull(s.r, s.p); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			s.torn = fmt.Errorf("%w: payload cut short at offset %d", ErrTorn, s.off)
		} else {
			s.err = err
		}
		return nil, false
	}
	if crc32.Checksum(s.p, crcTable) != binary.LittleEndian.Uint32(hdr[4:]) {
		s.torn = fmt.Errorf("%w: checksum mismatch at offset %d", ErrTorn, s.off)
		return nil, false
	}
	s.off += HeaderLen + int64(n)
	return s.p, true
}

// Offset is where the intact frames read so far end.
func (s *Scanner) Offset() int64 { return s.off }

// Torn says why scanning stopped before the end of the input (wrapping
// ErrTorn), or nil when it reached the end cleanly.
func (s *Scanner) Torn() error { return s.torn }

// Err is a read error other than a torn log.
func (s *Scanner) Err() error { return s.err }

// AppendBytes appends p with its length.
func AppendBytes(dst, p []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(p)))
	return append(dst, p...)
}

// AppendString appends s with its length.
func AppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// ErrCorrupt says that a payload's fields do not decode.
var ErrCorrupt = errors.New("corrupt record")

// Decoder reads a payload's fields; the first error sticks in Err, and
// later reads return zero values.
type Decoder struct {
	P   []byte // what is left to read
	Err error
}

func (r *Decoder) Uvarint() uint64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.P)
	if n <= 0 {
		r.Err = ErrCorrupt
		return 0
	}
	r.P = r.P[n:]
	return v
}

func (r *Decoder) Varint() int64 {
	if r.Err != nil {
		return 0
	}
	v, n := binary.Varint(r.P)
	if n <= 0 {
		r.Err = ErrCorrupt
		return 0
	}
	r.P = r.P[n:]
	return v
}

// Bytes returns length-prefixed bytes, sharing the payload's memory.
func (r *Decoder) Bytes() []byte {
	n := r.Uvarint()
	if r.Err != nil {
		return nil
	}
	if n > uint64(len(r.P)) {
		r.Err = ErrCorrupt
		return nil
	}
	v := r.P[:n:n]
	r.P = r.P[n:]
	return v
}

// Text returns length-prefixed bytes as a string.
func (r *Decoder) Text() string { return string(r.Bytes()) }
