package backoff

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"
)

func TestDelay(t *testing.T) {
	lo, hi := 100*time.Millisecond, 5*time.Second
	for n, want := range map[int]time.Duration{1: lo, 2: 2 * lo, 3: 4 * lo, 7: hi, 100: hi} {
		for i := 0; i < 50; i++ {
			if d := Delay(n, lo, hi); d < want/2 || d > want {
				t.Fatalf("Delay(%d) = %v, want within [%v, %v]", n, d, want/2, want)
			}
		}
	}
}

func TestTracker(t *testing.T) {
	now := time.Unix(1000, 0)
	tr := NewTracker("store", "backing off", slog.New(slog.DiscardHandler), func() time.Time { return now })
	if !tr.Ready() {
		t.Fatal("new tracker not ready")
	}
	tr.Fail(now, errors.New("refused"))
	if tr.Ready() {
		t.Fatal("ready after a failure")
	}
	// The pause is in force: what is left of it is the hold.
	if d := tr.Pause(); d < 50*time.Millisecond || d > 100*time.Millisecond {
		t.Fatalf("pause after the first failure %v, want within [50ms, 100ms]", d)
	}
	now = now.Add(time.Minute) // the pause is over
	if d := tr.Pause(); d != 0 {
		t.Fatalf("pause %v after it ended, want 0", d)
	}
	if tr.Ready() {
		t.Fatal("ready before the dependency answered again")
	}
	began := now // a call made during the outage
	now = now.Add(time.Second)
	tr.OK()
	if !tr.Ready() {
		t.Fatal("not ready after a success")
	}
	// That call's timeout arrives after the success: the outage is over.
	tr.Fail(began, errors.New("i/o timeout"))
	if !tr.Ready() {
		t.Fatal("not ready after a failure of a call made before the success")
	}
	tr.Fail(now, errors.New("refused"))
	if tr.Ready() {
		t.Fatal("ready after a failure of a call made after the success")
	}
}

func TestStrikes(t *testing.T) {
	var s Strikes
	for want := 1; want <= 3; want++ {
		if got := s.Add("a"); got != want {
			t.Fatalf("delivery %d of a counted as %d", want, got)
		}
	}
	if got := s.Add("b"); got != 1 {
		t.Fatalf("first delivery of b counted as %d", got)
	}
	var logged []int
	for n := 1; n <= 1000; n++ {
		if Report(n) {
			logged = append(logged, n)
		}
	}
	if fmt.Sprint(logged) != "[1 10 100 1000]" {
		t.Fatalf("reported at %v, want the first and every tenfold", logged)
	}
}
