package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestConsoleLayout: in Chromium, at the widths people use, the console's
// counter cards fill their last row (five cards in rows of three left a
// hole), and the horizon advice, which changes every second, stays plain
// text instead of flashing in the links' colour.
func TestConsoleLayout(t *testing.T) {
	t.Parallel()
	testenv.Chromium(t) // before the build, to skip at once without it
	up := startUp(t)
	ctx, cancel := context.WithTimeout(newBrowser(t), 60*time.Second)
	defer cancel()
	tab := &browserTab{T: t, Ctx: ctx}
	tab.Do("open the console", chromedp.Navigate(up.consoleURL))
	// How far the last row's right edge falls short of the cards' box.
	const gap = `(() => {
		const box = document.getElementById("counts").getBoundingClientRect();
		const cards = [...document.getElementById("counts").children].map(c => c.getBoundingClientRect());
		const top = Math.max(...cards.map(c => c.top));
		const right = Math.max(...cards.filter(c => Math.abs(c.top - top) < 1).map(c => c.right));
		return String(Math.round(box.right - right));
	})()`
	for _, width := range []int64{1280, 1024, 800, 600, 390} {
		tab.Do(fmt.Sprintf("resize to %d px", width), chromedp.EmulateViewport(width, 900))
		if g := tab.Eval(gap); g != "0" {
			t.Errorf("at %d px the counter cards' last row ends %s px short of the row above", width, g)
		}
	}
	tab.Wait("the horizon advice", `document.getElementById("advice").textContent !== ""`)
	// The advice names how long it has watched, so it changes each second.
	first := tab.Eval(`document.getElementById("advice").textContent`)
	tab.Wait("the advice to change", fmt.Sprintf(`document.getElementById("advice").textContent !== %q`, first))
	if c := tab.Eval(`document.getElementById("advice").className`); c != "hint small" {
		t.Errorf("the advice line's classes %q after it changed, want plain hint text", c)
	}
}
