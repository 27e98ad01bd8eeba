package dedup

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Errors a timestamp attribute can have; the pipeline puts them in the
// dead-letter reason.
var (
	ErrTimestampMissing   = errors.New("timestamp attribute missing")
	ErrTimestampMalformed = errors.New("timestamp attribute malformed")
)

// ParseTimestamp reads a timestamp attribute the way Beam's PubsubClient
// does: integer milliseconds since the Unix epoch first, then RFC 3339.
// Digits below the millisecond are dropped, as Beam keeps millisecond
// precision.
func ParseTimestamp(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, ErrTimestampMissing
	}
	if ms, err := strconv.ParseInt(s, 10, 64); err == nil {
		if ms < minMs || ms > maxMs {
			return time.Time{}, fmt.Errorf("%w: %q milliseconds is outside years 0001–9999", ErrTimestampMalformed, s)
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is neither milliseconds since the epoch nor RFC 3339", ErrTimestampMalformed, s)
	}
	// RFC 3339 allows year 0000, and an offset can push 0001 or 9999 over
	// the edge; both forms must accept the same instants, so a time read
	// here can always be written back as milliseconds.
	if ms := t.UnixMilli(); ms < minMs || ms > maxMs {
		return time.Time{}, fmt.Errorf("%w: %q is outside years 0001–9999", ErrTimestampMalformed, s)
	}
	return t.Truncate(time.Millisecond).UTC(), nil
}

// The instants both forms accept: 0001-01-01T00:00:00Z to
// 9999-12-31T23:59:59.999Z, the range of RFC 3339 years in UTC.
const (
	minMs = -62135596800000
	maxMs = 253402300799999
)
