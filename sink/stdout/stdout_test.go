package stdout_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/stdout"
)

func TestLines(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 123e6, time.UTC)
	cases := []struct {
		name string
		m    sink.Message
		want string
	}{
		{"text", sink.Message{ID: "1", Key: "k", Data: []byte(`{"n":1}`), Attributes: map[string]string{"a": "b"}, EventTime: ts, PublishTime: ts},
			`{"key":"k","message_id":"1","data":"{\"n\":1}","attributes":{"a":"b"},"event_time":"2026-01-02T03:04:05.123Z","publish_time":"2026-01-02T03:04:05.123Z"}`},
		{"binary", sink.Message{ID: "2", Key: "k", Data: []byte{0xff, 0}, EventTime: ts, PublishTime: ts},
			`{"key":"k","message_id":"2","data_base64":"/wA=","attributes":{},"event_time":"2026-01-02T03:04:05.123Z","publish_time":"2026-01-02T03:04:05.123Z"}`},
		{"empty, no key", sink.Message{ID: "3", Attributes: map[string]string{"nul": "a\x00", "bad": "\xfe"}, EventTime: ts, PublishTime: ts},
			`{"key":"3","message_id":"3","data":"","attributes":{"bad":{"base64":"/g=="},"nul":"a\u0000"},"event_time":"2026-01-02T03:04:05.123Z","publish_time":"2026-01-02T03:04:05.123Z"}`},
	}
	for _, c := range cases {
		var buf bytes.Buffer
		if err := stdout.New(&buf).Write(context.Background(), &c.m); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := buf.String(); got != c.want+"\n" {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
	bad := sink.Message{ID: "4", Attributes: map[string]string{"\xff": "v"}}
	if err := stdout.New(&bytes.Buffer{}).Write(context.Background(), &bad); !errors.Is(err, sink.ErrPermanent) {
		t.Fatalf("invalid attribute name: %v, want ErrPermanent", err)
	}
}

// Concurrent writes never interleave, every line decodes, and the payload
// round-trips through data or data_base64.
func TestConcurrentWritesAndRoundTrip(t *testing.T) {
	var out bytes.Buffer
	bw := bufio.NewWriterSize(&out, 16) // flushed per line, or lines would be stuck in it
	s := stdout.New(bw)
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			data := []byte(strings.Repeat(fmt.Sprint(i), 50))
			if i%2 == 1 {
				data = append(data, 0xff)
			}
			if err := s.Write(context.Background(), &sink.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("k", i), Data: data}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 200 {
		t.Fatalf("%d lines, want 200", len(lines))
	}
	for _, l := range lines {
		var v struct {
			MessageID  string  `json:"message_id"`
			Data       *string `json:"data"`
			DataBase64 *string `json:"data_base64"`
		}
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		var i int
		fmt.Sscan(v.MessageID, &i)
		want := strings.Repeat(v.MessageID, 50)
		var got []byte
		switch {
		case v.Data != nil && v.DataBase64 == nil:
			got = []byte(*v.Data)
		case v.DataBase64 != nil && v.Data == nil:
			got, _ = base64.StdEncoding.DecodeString(*v.DataBase64)
			want += "\xff"
		default:
			t.Fatalf("line %q: want exactly one of data and data_base64", l)
		}
		if string(got) != want || (i%2 == 1) != (v.DataBase64 != nil) {
			t.Fatalf("message %s: payload %q, want %q", v.MessageID, got, want)
		}
	}
}

type failing struct{}

func (failing) Write([]byte) (int, error) { return 0, errors.New("broken pipe") }

func TestWriterError(t *testing.T) {
	err := stdout.New(failing{}).Write(context.Background(), &sink.Message{ID: "1"})
	if err == nil || errors.Is(err, sink.ErrPermanent) {
		t.Fatalf("err = %v, want a retryable error", err)
	}
}

// short takes the first max bytes of a write and fails; it counts writes.
type short struct {
	bytes.Buffer
	max    int
	writes int
}

func (s *short) Write(b []byte) (int, error) {
	s.writes++
	if len(b) > s.max {
		s.Buffer.Write(b[:s.max])
		return s.max, errors.New("broken pipe")
	}
	return s.Buffer.Write(b)
}

// TestWriteBatch: a batch is one write; a message that cannot be encoded
// fails alone; when the writer fails partway, the messages whose whole
// line it took are written and only the rest fail.
func TestWriteBatch(t *testing.T) {
	ms := []*sink.Message{
		{ID: "1", Data: []byte("a")},
		{ID: "2", Attributes: map[string]string{"\xff": "v"}},
		{ID: "3", Data: []byte("c")},
		{ID: "4", Data: []byte("d")},
	}
	w := &short{max: 1 << 20}
	errs := make([]error, len(ms))
	stdout.New(w).WriteBatch(context.Background(), ms, errs)
	if w.writes != 1 {
		t.Errorf("a batch took %d writes, want 1", w.writes)
	}
	if errs[0] != nil || errs[2] != nil || errs[3] != nil || !errors.Is(errs[1], sink.ErrPermanent) {
		t.Fatalf("errors %v: want only message 2's, permanent", errs)
	}
	if lines := strings.Count(w.String(), "\n"); lines != 3 {
		t.Fatalf("%d lines written, want 3:\n%s", lines, w.String())
	}

	one, _ := stdout.Encode(ms[0])
	w = &short{max: len(one) + 5} // message 1's line and part of message 3's
	stdout.New(w).WriteBatch(context.Background(), ms, errs)
	if errs[0] != nil || errs[2] == nil || errs[3] == nil {
		t.Fatalf("writer failing after the first line: errors %v, want messages 3 and 4 failed, 1 written", errs)
	}
}
