package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// Budgets of the browser tests, each for one thing to happen, so that a slow
// step on a loaded machine (2 shared cores, a dozen tests beside, the race
// detector) does not eat the budget of the next, and a failure names the
// step that did not happen. With two CPU hogs beside the other engineers'
// builds (load 15-22 on 2 cores), Chromium started in 1.7 s and the slowest
// step took 0.6 s; the budgets are far above that and still end a stuck
// test within minutes.
const (
	browserStart = 2 * time.Minute  // Chromium starts and opens its tab
	stepBudget   = time.Minute      // one action or evaluation
	waitBudget   = 90 * time.Second // one condition to come true
	reportBudget = 10 * time.Second // reading the page's state for a failure
)

// failer is what a browserTab needs of its test: *testing.T, or a recorder in
// the helper's own test.
type failer interface {
	Helper()
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
	FailNow()
}

// newBrowser starts headless Chromium for a test and returns its tab's
// context, on which the browser has already run: a deadline derived from it
// limits a step, not the browser. The browser stops when the test ends.
func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(testenv.Chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // tests run as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 1000),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	t.Cleanup(func() { cancelTab(); cancelAlloc() })
	// The first run starts the browser, and a deadline on its context would
	// stop the whole browser when it passed: wait for the start apart.
	started := make(chan error, 1)
	go func() { started <- chromedp.Do(ctx) }()
	select {
	case err := <-started:
		if err != nil {
			t.Fatalf("starting Chromium: %v", err)
		}
	case <-time.After(browserStart):
		cancelTab()
		t.Fatalf("Chromium did not open a tab within %v: %v", browserStart, <-started)
	}
	return ctx
}

// browserTab drives one page of a test's browser. Ctx is the tab's context
// (newBrowser); each step runs under a budget of its own. Report, when set,
// adds the page's state to a failure; it should read with State, which never
// fails.
type browserTab struct {
	T         failer
	Ctx       context.Context
	Report    func() string
	reporting bool
}

// fail ends the test with the cause first and the page's state after it: the
// state is context, and a report that cannot read the page (or fails itself)
// never takes the cause's place.
func (b *browserTab) fail(format string, args ...any) {
	b.T.Helper()
	b.T.Errorf(format, args...)
	if b.Report != nil && !b.reporting {
		b.reporting = true
		b.T.Logf("page state:\n%s", b.Report())
	}
	b.T.FailNow()
}

// Do runs actions within stepBudget; what names them in a failure.
func (b *browserTab) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, stepBudget)
	defer cancel()
	start := time.Now()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.fail("%s: %v (after %v)", what, err, time.Since(start).Round(time.Millisecond))
	}
}

// Eval returns the value of a JavaScript expression of string type.
func (b *browserTab) Eval(js string) string {
	b.T.Helper()
	ctx, cancel := context.WithTimeout(b.Ctx, stepBudget)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.fail("evaluate %s: %v", js, err)
	}
	return v
}

// State is Eval for a failure's report: an expression it cannot read is
// shown as such instead of ending the test.
func (b *browserTab) State(js string) string {
	ctx, cancel := context.WithTimeout(b.Ctx, reportBudget)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](js))
	if err != nil {
		return fmt.Sprintf("(unreadable: %v)", err)
	}
	return v
}

// Wait waits up to waitBudget until a JavaScript condition holds.
func (b *browserTab) Wait(what, cond string) {
	b.T.Helper()
	b.waitWithin(waitBudget, what, cond)
}

func (b *browserTab) waitWithin(budget time.Duration, what, cond string) {
	b.T.Helper()
	// The context's deadline is a little beyond the poll's own, so the poll
	// says that the condition never held rather than that time ran out.
	ctx, cancel := context.WithTimeout(b.Ctx, budget+reportBudget)
	defer cancel()
	start := time.Now()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(budget), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		b.fail("waiting for %s: %v after %v; the condition: %s", what, err, time.Since(start).Round(time.Millisecond), cond)
	}
}
