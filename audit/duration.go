package audit

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseDuration reads a duration as time.ParseDuration does, and also in
// days with a d suffix ("7d", "1.5d"), since audit horizons are counted in
// days and Go's durations stop at hours.
func ParseDuration(s string) (time.Duration, error) {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil || n < 0 || n > 3650 {
			return 0, fmt.Errorf("duration %q: want a number of days up to 3650 before d, or a Go duration such as 36h", s)
		}
		return time.Duration(n * float64(24*time.Hour)), nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("duration %q: want a Go duration such as 36h or days such as 7d", s)
	}
	return d, nil
}
