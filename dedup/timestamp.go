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
		const maxMs = 253402300799999 // 9999-12-31T23:59:59.999Z
		if ms < -62135596800000 || ms > maxMs {
			return time.Time{}, fmt.Errorf("%w: %q milliseconds is out of range", ErrTimestampMalformed, s)
		}
		return time.UnixMilli(ms).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is neither milliseconds since the epoch nor RFC 3339", ErrTimestampMalformed, s)
	}
	return t.Truncate(time.Millisecond).UTC(), nil
}
