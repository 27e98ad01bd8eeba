// Package stdout is a sink that prints one JSON object per line, for pipes
// (dedupflow pipeline --sink stdout | jq …) and for debugging.
//
// A line looks like
//
//	{"key":"order-7","message_id":"42","data":"{\"n\":1}","attributes":{"dedupflow_id":"order-7"},"event_time":"2026-01-02T03:04:05.123Z","publish_time":"2026-01-02T03:04:05.2Z"}
//
// The payload is in "data" as a string when it is valid UTF-8, and in
// "data_base64" (standard encoding, padded) otherwise: exactly one of the
// two is present, so a reader tells them apart by the field name and never
// has to guess whether a string is base64. An attribute value that is not
// valid UTF-8 (JSON strings cannot carry it) is written as
// {"base64":"..."} instead of a string. Messages passed without dedup are
// keyed on their message ID, as in the PostgreSQL sink.
package stdout

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/sink"
)

// Sink writes JSON lines to a writer.
type Sink struct {
	mu sync.Mutex // one line at a time: lines never interleave
	w  io.Writer
}

var _ sink.BatchSink = (*Sink)(nil)

// New writes to w. If w has a Flush() error method (a *bufio.Writer), it is
// called after every line, so a reader sees each message as it is acked.
func New(w io.Writer) *Sink { return &Sink{w: w} }

type line struct {
	Key         string         `json:"key"`
	MessageID   string         `json:"message_id"`
	Data        *string        `json:"data,omitempty"`
	DataBase64  *string        `json:"data_base64,omitempty"`
	Attributes  map[string]any `json:"attributes"`
	EventTime   string         `json:"event_time"`
	PublishTime string         `json:"publish_time"`
}

// Write implements sink.Sink. It returns once the line is handed to the
// writer (and flushed); an error of the writer (a closed pipe) is returned
// as is, so the message is nacked, not lost.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("write message %s to stdout: %w", m.ID, err)
	}
	b, err := Encode(m)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.w.Write(b); err != nil {
		return fmt.Errorf("write message %s to stdout: %w", m.ID, err)
	}
	if f, ok := s.w.(interface{ Flush() error }); ok {
		if err := f.Flush(); err != nil {
			return fmt.Errorf("flush message %s to stdout: %w", m.ID, err)
		}
	}
	return nil
}

// WriteBatch implements sink.BatchSink: the lines of every message that
// encodes go to the writer in one write (and one flush). A message that
// does not encode fails alone, permanently; when the writer fails, the
// messages whose lines it had taken whole are written, the rest fail.
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	if err := ctx.Err(); err != nil {
		for i, m := range ms {
			errs[i] = fmt.Errorf("write message %s to stdout: %w", m.ID, err)
		}
		return
	}
	var buf []byte
	ends := make([]int, len(ms)) // where each message's line ends in buf; -1: not encoded
	for i, m := range ms {
		b, err := Encode(m)
		errs[i], ends[i] = err, -1
		if err == nil {
			buf = append(buf, b...)
			ends[i] = len(buf)
		}
	}
	if len(buf) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n, err := s.w.Write(buf)
	if err == nil {
		if f, ok := s.w.(interface{ Flush() error }); ok {
			// What a flush fails to pass on cannot be told apart by line.
			n, err = 0, f.Flush()
		}
	}
	if err == nil {
		return
	}
	for i, m := range ms {
		if ends[i] > n {
			errs[i] = fmt.Errorf("write message %s to stdout: %w", m.ID, err)
		}
	}
}

// Encode returns m's line, newline included.
func Encode(m *sink.Message) ([]byte, error) {
	l := line{
		Key:         m.Key,
		MessageID:   m.ID,
		Attributes:  make(map[string]any, len(m.Attributes)),
		EventTime:   m.EventTime.UTC().Format(time.RFC3339Nano),
		PublishTime: m.PublishTime.UTC().Format(time.RFC3339Nano),
	}
	if l.Key == "" {
		l.Key = m.ID
	}
	if utf8.Valid(m.Data) {
		d := string(m.Data)
		l.Data = &d
	} else {
		d := base64.StdEncoding.EncodeToString(m.Data)
		l.DataBase64 = &d
	}
	for k, v := range m.Attributes {
		if !utf8.ValidString(k) {
			// A name has no escape that a reader could not confuse with
			// a real name; Pub/Sub itself never delivers one.
			return nil, fmt.Errorf("%w: attribute name %q is not valid UTF-8", sink.ErrPermanent, k)
		}
		if utf8.ValidString(v) {
			l.Attributes[k] = v
		} else {
			l.Attributes[k] = map[string]string{"base64": base64.StdEncoding.EncodeToString([]byte(v))}
		}
	}
	if !utf8.ValidString(l.Key) || !utf8.ValidString(l.MessageID) {
		return nil, fmt.Errorf("%w: key %q or message ID %q is not valid UTF-8", sink.ErrPermanent, l.Key, l.MessageID)
	}
	b, err := json.Marshal(l)
	if err != nil {
		return nil, fmt.Errorf("%w: encode message %s: %w", sink.ErrPermanent, m.ID, err)
	}
	return append(b, '\n'), nil
}
