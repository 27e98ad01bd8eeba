package e2e

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// recorder is a failer that keeps what a failure says, and ends the
// goroutine at FailNow as testing.T does.
type recorder struct{ lines []string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}
func (r *recorder) Logf(format string, args ...any) {
	r.lines = append(r.lines, fmt.Sprintf(format, args...))
}
func (r *recorder) FailNow()       { runtime.Goexit() }
func (r *recorder) String() string { return strings.Join(r.lines, "\n") }

// TestBrowserTabNamesTheCause: a condition that never comes true fails with
// what was awaited, the condition and how long it waited, followed by the
// page's state; the report reads the page with a budget of its own, so it
// never replaces the cause with its own timeout.
func TestBrowserTabNamesTheCause(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	rec := &recorder{}
	tab := &browserTab{T: rec, Ctx: ctx}
	tab.Report = func() string { return "count: " + tab.State(`document.querySelector("dd[data-count]").textContent`) }
	done := make(chan struct{})
	go func() {
		defer close(done)
		tab.Do("open a page", chromedp.Navigate(`data:text/html,<dl><dd data-count="received">3</dd></dl>`))
		tab.waitWithin(time.Second, "four messages", `document.querySelector("dd[data-count]").textContent === "4"`)
	}()
	<-done
	for _, want := range []string{"waiting for four messages:", `textContent === "4"`, "page state:\ncount: 3"} {
		if !strings.Contains(rec.String(), want) {
			t.Errorf("failure %q does not say %q", rec.String(), want)
		}
	}
	if strings.Contains(rec.String(), "unreadable") {
		t.Errorf("the report could not read the page: %q", rec.String())
	}

	// A tab whose context has ended still names what it waited for; the
	// report says it could not read the page, after the cause.
	late, cancel := context.WithTimeout(ctx, time.Millisecond)
	defer cancel()
	<-late.Done()
	rec = &recorder{}
	tab = &browserTab{T: rec, Ctx: late, Report: tab.Report}
	done = make(chan struct{})
	go func() {
		defer close(done)
		tab.Wait("four messages", `false`)
	}()
	<-done
	if !strings.HasPrefix(rec.String(), "waiting for four messages:") {
		t.Errorf("with the tab's context ended, the failure is %q; want the cause first", rec.String())
	}
}
