package dedup

import (
	"errors"
	"strconv"
	"testing"
	"time"
)

func TestParseTimestamp(t *testing.T) {
	cases := []struct {
		in   string
		want time.Time
		err  error
	}{
		{"1700000000123", time.UnixMilli(1700000000123), nil},
		{"0", time.UnixMilli(0), nil},
		{"-1000", time.UnixMilli(-1000), nil},
		{"2023-11-14T22:13:20.123Z", time.UnixMilli(1700000000123), nil},
		{"2023-11-14T22:13:20.123456789Z", time.UnixMilli(1700000000123), nil}, // below ms dropped
		{"2023-11-14T23:13:20+01:00", time.UnixMilli(1700000000000), nil},
		{"2023-11-14T22:13:20Z", time.UnixMilli(1700000000000), nil},
		{"", time.Time{}, ErrTimestampMissing},
		{"yesterday", time.Time{}, ErrTimestampMalformed},
		{"2023-11-14 22:13:20", time.Time{}, ErrTimestampMalformed},
		{"1700000000123.5", time.Time{}, ErrTimestampMalformed},
		{"99999999999999999", time.Time{}, ErrTimestampMalformed},    // past year 9999
		{"0000-01-01T00:00:00Z", time.Time{}, ErrTimestampMalformed}, // before year 1
		{"0001-01-01T00:00:00+01:00", time.Time{}, ErrTimestampMalformed},
		{"9999-12-31T23:59:59-01:00", time.Time{}, ErrTimestampMalformed},
		{"0001-01-01T00:00:00Z", time.UnixMilli(-62135596800000), nil},
	}
	for _, c := range cases {
		got, err := ParseTimestamp(c.in)
		if !errors.Is(err, c.err) {
			t.Errorf("ParseTimestamp(%q) error %v, want %v", c.in, err, c.err)
			continue
		}
		if err == nil && !got.Equal(c.want) {
			t.Errorf("ParseTimestamp(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

func FuzzParseTimestamp(f *testing.F) {
	for _, s := range []string{"1700000000123", "2023-11-14T22:13:20.123Z", "", "x", "-0", "9223372036854775807"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ts, err := ParseTimestamp(s)
		if err != nil {
			if !errors.Is(err, ErrTimestampMissing) && !errors.Is(err, ErrTimestampMalformed) {
				t.Fatalf("error %v is not one of the named ones", err)
			}
			return
		}
		if ts.Nanosecond()%int(time.Millisecond) != 0 {
			t.Fatalf("%q parsed below millisecond precision: %v", s, ts)
		}
		// A parsed time written back as milliseconds reads the same.
		again, err := ParseTimestamp(strconv.FormatInt(ts.UnixMilli(), 10))
		if err != nil || !again.Equal(ts) {
			t.Fatalf("%q: %v does not round-trip (%v, %v)", s, ts, again, err)
		}
	})
}
