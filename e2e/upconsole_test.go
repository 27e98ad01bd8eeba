package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestUpConsoleBrowser drives the console of `dedupflow up` from real
// Chromium: the tutorial's messages through the form, a redelivery, and a payload
// that must stay text.
func TestUpConsoleBrowser(t *testing.T) {
	t.Parallel()
	testenv.Chromium(t) // before the build, to skip at once without it
	up := startUp(t)
	ctx := newBrowser(t)

	tab := &browserTab{T: t, Ctx: ctx}
	tab.Report = func() string {
		return fmt.Sprintf("counters: %s\nrows: %s\nstatus: %s\nstderr:\n%s", tab.State(jsCounts), tab.State(jsRows),
			tab.State(`document.getElementById("form-status").textContent + " | " + document.getElementById("redeliver-status").textContent`), up.stderr)
	}
	do, eval, waitPage := tab.Do, tab.Eval, tab.Wait
	publish := func(message, key string, copies int) {
		t.Helper()
		do("fill the form",
			chromedp.SetValue(chromedp.CSS("#message"), message),
			// SetValue reports an empty value as a failure.
			chromedp.Evaluate[chromedp.Void](`document.getElementById("key").value = `+strconv.Quote(key)),
			chromedp.SetValue(chromedp.CSS("#copies"), strconv.Itoa(copies)),
			chromedp.Click(chromedp.CSS("#send")),
		)
		waitPage("publish of "+message, `document.getElementById("form-status").textContent.startsWith("Published")`+
			` && !document.getElementById("send").disabled`)
		// The next submission must not be mistaken for this one.
		do("clear status", chromedp.Evaluate[chromedp.Void](`document.getElementById("form-status").textContent = ""`))
	}
	counter := func(name string) string {
		return fmt.Sprintf(`document.querySelector('dd[data-count=%q]').textContent`, name)
	}

	do("open the console", chromedp.Navigate(up.consoleURL))
	// Count (and dismiss) any dialog: an escaped payload opens none.
	var dialogs atomic.Int32
	dialogEvents := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogEvents {
			if err != nil {
				return
			}
			dialogs.Add(1)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	waitPage("the live view to connect", `document.getElementById("conn").textContent === "Live"`)

	// A bad key is refused with a specific error next to the field.
	do("fill a bad key", chromedp.SetValue(chromedp.CSS("#message"), "x"), chromedp.SetValue(chromedp.CSS("#key"), " 123"),
		chromedp.Click(chromedp.CSS("#send")))
	waitPage("the key error", `!document.getElementById("key-err").hidden && document.getElementById("key-err").textContent.includes("spaces")`+
		` && document.getElementById("key").getAttribute("aria-invalid") === "true"`)

	// The tutorial: Message 1 with key 123, then 2, 3 and 4 with 456.
	publish("Message 1", "123", 1)
	publish("Message 2", "456", 1)
	publish("Message 3", "456", 1)
	publish("Message 4", "456", 1)
	waitPage("the scenario to pass through",
		counter("received")+` === "4" && `+counter("emitted")+` === "2" && `+counter("republish")+` === "2" && `+
			`document.querySelectorAll("#rows tr").length === 2`)
	if got := eval(jsRows); got != "Message 2|456;Message 1|123" {
		t.Errorf("live view: %q, want Message 2 (456) above Message 1 (123)", got)
	}
	if got := eval(counter("redelivery")); got != "0" {
		t.Errorf("redeliveries before any redelivery: %s", got)
	}

	// Redeliver Message 2: the pipeline's subscription is sought back to
	// just before it, so Pub/Sub delivers Messages 2, 3 and 4 again with
	// their IDs. Message 2 is a redelivery; 3 and 4 are the same copies of
	// its key as before, so they count as republishes again.
	do("redeliver Message 2", chromedp.Evaluate[chromedp.Void](
		`[...document.querySelectorAll("#rows tr")].find(tr => tr.querySelector("td.data").textContent === "Message 2").querySelector("button").click()`))
	// Received may pass 7: a copy that arrives while Message 2 is being
	// judged is nacked as in flight and counted again when it returns.
	waitPage("the redelivery to be counted",
		`Number(`+counter("received")+`) >= 7 && `+counter("redelivery")+` === "1" && `+counter("republish")+` === "4"`)
	if got := eval(jsRows); got != "Message 2|456;Message 1|123" {
		t.Errorf("live view after the redelivery: %q, want no new output", got)
	}
	if got := eval(counter("emitted")); got != "2" {
		t.Errorf("emitted after the redelivery: %s, want still 2", got)
	}
	if s := eval(`document.getElementById("redeliver-status").textContent`); s == "" {
		t.Error("no redelivery status shown")
	}
	if os.Getenv("DEDUPFLOW_UPDATE_SCREENSHOT") != "" {
		do("unfocus", chromedp.Evaluate[chromedp.Void](`document.activeElement.blur(); getSelection().removeAllRanges()`))
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join("..", "docs", "console.png")
		if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(out, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s", out)
	}

	// A payload that is HTML stays text.
	const xss = `<img src=x onerror=alert(1)>`
	publish(xss, "xss", 1)
	waitPage("the HTML payload as text", `[...document.querySelectorAll("#rows td.data")].some(td => td.textContent === `+strconv.Quote(xss)+`)`)
	if n := eval(`String(document.querySelectorAll("img").length)`); n != "0" {
		t.Errorf("%s img elements on the page, want 0", n)
	}
	// No key: counted as missing, deduplicated by message ID, shown so.
	publish("No key here", "", 1)
	waitPage("the keyless message", counter("missing_key")+` === "1" && `+
		`[...document.querySelectorAll("#rows tr")].some(tr => tr.querySelector("td.data").textContent === "No key here" && tr.querySelector("td.key").textContent === "none")`)
	// Copies act out a publisher retry: one output, two more republishes.
	publish("Message 6", "789", 3)
	waitPage("three copies to collapse", counter("republish")+` === "6" && `+counter("emitted")+` === "5"`)
	// Horizon advice states its basis, and that a handful of copies is not enough.
	waitPage("the horizon advice", `document.querySelector("#advice").textContent.startsWith("not enough data for horizon advice: 6 republished copies")`)
	if n := dialogs.Load(); n != 0 {
		t.Errorf("%d JavaScript dialogs opened, want none", n)
	}
}

const (
	jsRows   = `[...document.querySelectorAll("#rows tr")].map(tr => tr.querySelector("td.data").textContent + "|" + tr.querySelector("td.key").textContent).join(";")`
	jsCounts = `[...document.querySelectorAll("dd[data-count]")].map(d => d.dataset.count + "=" + d.textContent).join(" ")`
)
