package e2e

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
)

// TestBrokerConsoleFlag: `dedupflow broker --console` serves the broker
// page, which shows the broker's topics.
func TestBrokerConsoleFlag(t *testing.T) {
	t.Parallel()
	b := runCommand(t, "broker", "--listen", "127.0.0.1:0", "--console", "127.0.0.1:0", "--project", "p", "--topic", "orders")
	url := b.waitFor(t, "broker page URL", reBrokerPage)
	if body := testenv.Get(t, url); !strings.Contains(body, "<title>dedupflow broker</title>") {
		t.Fatalf("broker page:\n%s", body)
	}
	var state struct{ Topics []struct{ Name string } }
	if err := json.Unmarshal([]byte(testenv.Get(t, strings.TrimSuffix(url, "/broker")+"/broker/api/state")), &state); err != nil ||
		len(state.Topics) != 1 || state.Topics[0].Name != "projects/p/topics/orders" {
		t.Fatalf("state: %+v %v", state, err)
	}
}

// TestUpBrokerPage: the console of `dedupflow up` links to and serves the
// broker page, which links back to the console.
func TestUpBrokerPage(t *testing.T) {
	t.Parallel()
	up := startUp(t)
	if !strings.Contains(testenv.Get(t, up.consoleURL), `href="/broker"`) {
		t.Fatal("the console does not link to /broker")
	}
	if body := testenv.Get(t, up.consoleURL+"/broker"); !strings.Contains(body, `<a id="console-link" href="/">`) {
		t.Errorf("the broker page does not link back to the console at /:\n%s", body)
	}
	if body := testenv.Get(t, up.consoleURL+"/broker/api/state"); !strings.Contains(body, "topicToDataflow") {
		t.Fatalf("broker page state lacks the tutorial's topics:\n%s", body)
	}
}

const pageProject = "brokerpage-test"

// startBrokerPage runs `dedupflow broker --console` with a topic "orders"
// and its subscription "orders-sub", and a subscription of a name as long as
// the tutorial's; it returns the broker's address and the page's URL.
func startBrokerPage(t *testing.T) (addr, pageURL string) {
	t.Helper()
	b := runCommand(t, "broker", "--listen", "127.0.0.1:0", "--console", "127.0.0.1:0")
	addr = b.waitFor(t, "PUBSUB_EMULATOR_HOST line", reEmulator)
	pageURL = b.waitFor(t, "broker page URL", reBrokerPage)
	brokertest.CreateOrders(t, addr, pageProject)
	return addr, pageURL
}

// pullREST pulls up to 10 messages of sub through the broker's REST API.
func pullREST(t *testing.T, addr, sub string) []restReceived {
	t.Helper()
	var out struct{ ReceivedMessages []restReceived }
	postREST(t, addr, sub+":pull", `{"maxMessages":10}`, &out)
	return out.ReceivedMessages
}

type restReceived struct {
	AckID   string
	Message struct {
		Data       string
		Attributes map[string]string
	}
}

// postREST posts body to the broker's REST API at /v1/path, and decodes the
// answer into out.
func postREST(t *testing.T, addr, path, body string, out any) {
	t.Helper()
	resp, err := http.Post("http://"+addr+"/v1/"+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil || resp.StatusCode != 200 {
		t.Fatalf("POST %s: %d %v", path, resp.StatusCode, err)
	}
}

// TestBrokerPageBrowser drives the page of `dedupflow broker --console`
// from real Chromium: the live table, publishing with attributes, peeking
// (which takes nothing), seeking, and a payload that must stay text.
func TestBrokerPageBrowser(t *testing.T) {
	t.Parallel()
	testenv.Chromium(t) // before the build, to skip at once without it
	addr, pageURL := startBrokerPage(t)
	ctx := newBrowser(t)
	tab := &browserTab{T: t, Ctx: ctx}
	tab.Report = func() string {
		return "table: " + tab.State(`document.getElementById("subs").innerText`) + "\nstatus: " +
			tab.State(`["publish-status","seek-status","peek-status"].map(i => document.getElementById(i).textContent).join(" | ")`)
	}
	do, eval, waitPage := tab.Do, tab.Eval, tab.Wait
	sub := "projects/" + pageProject + "/subscriptions/orders-sub"
	cellOf := func(field string) string {
		return `document.querySelector('tr[data-sub="` + sub + `"] td[data-field="` + field + `"]').textContent`
	}

	do("open the page", chromedp.Navigate(pageURL))
	var dialogs atomic.Int32
	go func() {
		for _, err := range chromedp.Events(ctx, cdppage.JavascriptDialogOpening) {
			if err != nil {
				return
			}
			dialogs.Add(1)
			_, _ = chromedp.Call(ctx, cdppage.HandleJavaScriptDialog, cdppage.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	waitPage("the live table", `document.getElementById("conn").textContent === "Live" && `+cellOf("backlog")+` === "0"`)

	// At 1280 px, nothing is cut off: every Peek button is on screen.
	if got := eval(`String(document.documentElement.scrollWidth)`); got != eval(`String(document.documentElement.clientWidth)`) {
		t.Errorf("the page is %s px wide in a %s px window", got, eval(`String(document.documentElement.clientWidth)`))
	}
	if got := eval(`[...document.querySelectorAll("button.peek")].map(b => b.getBoundingClientRect().right <= document.documentElement.clientWidth).join()`); got != "true,true" {
		t.Errorf("Peek buttons within the window: %s, want both", got)
	}
	// The broker alone has no console to link back to (up's page does: TestUpBrokerPage).
	if got := eval(`String(document.getElementById("console-link") === null)`); got != "true" {
		t.Errorf("the broker's own page links to a console")
	}
	if got := eval(`getComputedStyle(document.querySelector("section")).borderRadius`); got != "8px" {
		t.Errorf("sections have border radius %q, want the console's panels (8px)", got)
	}

	// Publish markup with attributes: it arrives, and stays text.
	const payload = `<img src=x onerror=alert(1)><script>alert(2)</script>`
	do("publish", chromedp.SetValue(chromedp.CSS("#pub-topic"), "projects/"+pageProject+"/topics/orders"),
		chromedp.SetValue(chromedp.CSS("#pub-data"), payload),
		chromedp.SetValue(chromedp.CSS("#pub-attrs"), "origin=<b>page</b>\nkind=test\ntrace="+longAttr),
		chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the publish", `document.getElementById("publish-status").textContent.startsWith("Published")`)
	waitPage("the backlog to show it", cellOf("backlog")+` === "1"`)

	// A refresh changes the rows' text, not their elements: a Peek button
	// replaced between the press and the release of a click loses it.
	row := `document.querySelector('tr[data-sub="` + sub + `"]')`
	eval(row + `.querySelector("button.peek").dataset.mark = "kept"`)
	age := eval(row + `.cells[4].textContent`)
	waitPage("a refresh (the oldest unacked age moves on)", row+`.cells[4].textContent !== `+strconv.Quote(age))
	if got := eval(row + `.querySelector("button.peek").dataset.mark || "replaced"`); got != "kept" {
		t.Errorf("the Peek button after a refresh: %s, want the same element", got)
	}

	// Peek shows it and leaves it there.
	do("peek", chromedp.Click(chromedp.CSS(`tr[data-sub="`+sub+`"] button.peek`)))
	waitPage("the peeked message", `document.querySelectorAll("#peek tbody tr").length === 1`)
	if got := eval(`document.querySelector("#peek tbody tr td.data").textContent`); got != payload {
		t.Fatalf("peeked data %q, want %q as text", got, payload)
	}
	if got := eval(`document.querySelectorAll("#peek tbody tr td.data")[1].textContent`); got != "kind=test\norigin=<b>page</b>\ntrace="+longAttr {
		t.Fatalf("peeked attributes %q", got)
	}
	// A long attribute wraps inside its column: the page stays as wide as
	// the 1280 px window, and resource paths break only after a separator.
	if w, err := strconv.Atoi(eval(`String(document.documentElement.scrollWidth)`)); err != nil || w > 1280 {
		t.Errorf("after a peek of a long attribute the page is %d px wide in a 1280 px window (%v)", w, err)
	}
	if got := eval(jsMidWordBreaks(`#subs tbody td:nth-child(-n+2), #peek-sub`)); got != "" {
		t.Errorf("resource paths broken mid-word: %s", got)
	}
	if n := eval(`String(document.querySelectorAll("main img, main b, main script").length)`); n != "0" {
		t.Fatalf("the payload became %s elements", n)
	}
	// A pull gets only what no one has taken: the peeked message is there,
	// as published. The nack gives it back for the seek below.
	got := pullREST(t, addr, sub)
	if len(got) != 1 || got[0].Message.Attributes["origin"] != "<b>page</b>" || got[0].Message.Data != base64.StdEncoding.EncodeToString([]byte(payload)) {
		t.Fatalf("after peeking, a pull got %+v; want the message, untaken", got)
	}
	postREST(t, addr, sub+":modifyAckDeadline", `{"ackIds":["`+got[0].AckID+`"],"ackDeadlineSeconds":0}`, &struct{}{})
	waitPage("the nacked message back in the backlog", cellOf("backlog")+` === "1" && `+cellOf("unacked")+` === "0"`)

	// A bad attribute line and a publish the broker refuses say why.
	do("publish a bad attribute", chromedp.SetValue(chromedp.CSS("#pub-attrs"), "no equals sign"), chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the attribute error", `document.getElementById("publish-status").textContent.includes("want key=value")`)
	do("publish a reserved attribute", chromedp.SetValue(chromedp.CSS("#pub-attrs"), "googkey=1"), chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the broker's refusal", `document.getElementById("publish-status").classList.contains("bad") && document.getElementById("publish-status").textContent.includes("goog")`)

	// The time field's example is a time a user would seek to, not Go's
	// layout reference.
	hint := strings.TrimPrefix(eval(`document.getElementById("seek-time").placeholder`), "e.g. ")
	if at, err := time.Parse(time.RFC3339, hint); err != nil || time.Since(at) < 0 || time.Since(at) > 24*time.Hour {
		t.Errorf("the seek time's placeholder is %q; want an RFC 3339 example of a recent time (%v)", hint, err)
	}

	// Seeking past the message acknowledges it.
	future := time.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	do("seek", chromedp.SetValue(chromedp.CSS("#seek-sub"), sub), chromedp.SetValue(chromedp.CSS("#seek-time"), future), chromedp.Click(chromedp.CSS("#seek-send")))
	waitPage("the seek", `document.getElementById("seek-status").textContent.startsWith("Sought")`)
	waitPage("the backlog to empty", cellOf("backlog")+` === "0"`)
	do("seek to nothing", chromedp.SetValue(chromedp.CSS("#seek-time"), "yesterday"), chromedp.Click(chromedp.CSS("#seek-send")))
	waitPage("the time error", `document.getElementById("seek-status").textContent.includes("RFC 3339")`)
	if n := dialogs.Load(); n != 0 {
		t.Fatalf("%d dialogs opened: a payload ran as script", n)
	}
}

// longAttr is an attribute value with no place to break, such as a trace
// header or a token.
var longAttr = strings.Repeat("0af7651916cd43dd8448eb211c80319c", 8)

// jsMidWordBreaks is a JavaScript expression listing the elements matched
// by sel whose text wraps to a new line other than after a space, "/", "."
// or "-": the places a resource path may break without cutting a name.
func jsMidWordBreaks(sel string) string {
	return `[...document.querySelectorAll(` + strconv.Quote(sel) + `)].filter(el => {
		const walk = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
		let top = null, prev = "";
		for (let n; (n = walk.nextNode());) {
			for (let i = 0; i < n.length; i++) {
				const r = document.createRange();
				r.setStart(n, i);
				r.setEnd(n, i + 1);
				const box = r.getClientRects()[0];
				if (!box) continue;
				if (top !== null && box.top > top + 1 && !/[\s\/.-]/.test(prev)) return true;
				top = box.top;
				prev = n.data[i];
			}
		}
		return false;
	}).map(el => el.textContent).join(" | ")`
}
