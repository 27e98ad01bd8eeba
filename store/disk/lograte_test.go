package disk

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestPebbleErrorsRateLimited: Pebble reporting the same background error
// over and over (a full disk fails every flush and compaction it retries)
// logs one line a minute per kind of error, and the next line says how
// many were held back; another kind of error still gets its line.
func TestPebbleErrorsRateLimited(t *testing.T) {
	var b bytes.Buffer
	now := time.Unix(1_700_000_000, 0)
	l := pebbleLog{slog.New(slog.NewTextHandler(&b, nil)), newErrorLimit(func() time.Time { return now })}
	full := errors.New("no space left on device")
	for range 100 {
		l.Errorf("[JOB %d] flush error: %v", 7, full)
	}
	l.Errorf("background error: %v", errors.New("corrupt"))
	now = now.Add(errorEvery)
	l.Errorf("[JOB %d] flush error: %v", 8, full)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "flush error") || !strings.Contains(lines[1], "corrupt") ||
		!strings.Contains(lines[2], "[JOB 8] flush error") || !strings.HasSuffix(lines[2], "suppressed=99") {
		t.Errorf("log of 101 flush errors over a minute and one other error:\n%s", &b)
	}
}
