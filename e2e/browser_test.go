package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// newBrowser starts headless Chromium for a test; it stops when the test ends.
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
	return ctx
}

// browserTab drives one page of a test's browser; Report, when set, adds the
// page's state to a failure.
type browserTab struct {
	T      *testing.T
	Ctx    context.Context
	Report func() string
}

func (b *browserTab) fail(format string, args ...any) {
	b.T.Helper()
	if b.Report != nil {
		format += "\n%s"
		args = append(args, b.Report())
	}
	b.T.Fatalf(format, args...)
}

// Do runs actions; what names them in a failure.
func (b *browserTab) Do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.T.Helper()
	if err := chromedp.Do(b.Ctx, actions...); err != nil {
		b.fail("%s: %v", what, err)
	}
}

// Eval returns the value of a JavaScript expression of string type.
func (b *browserTab) Eval(js string) string {
	b.T.Helper()
	v, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](js))
	if err != nil {
		b.T.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// Wait waits up to 15s until a JavaScript condition holds.
func (b *browserTab) Wait(what, cond string) {
	b.T.Helper()
	_, err := chromedp.Run(b.Ctx, chromedp.Poll[bool](cond, chromedp.WithPollingTimeout(15*time.Second), chromedp.WithPollingInterval(50*time.Millisecond)))
	if err != nil {
		b.fail("waiting for %s: %v", what, err)
	}
}
