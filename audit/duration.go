package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// units says which units ParseDuration reads, for its errors.
const units = "ms, s, m, h or d (as in 500ms, 90s, 10m, 36h, 7d; 1h30m also works)"

// ParseDuration reads a duration as time.ParseDuration does, and also in
// days with a d suffix ("7d", "1.5d"), since audit horizons are counted in
// days and Go's durations stop at hours.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("duration %q: want a number of days up to 3650 before d (7d, 1.5d), or another unit: %s", s, units)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a number and a unit: %s", s, units)
	}
	return d, nil
}
