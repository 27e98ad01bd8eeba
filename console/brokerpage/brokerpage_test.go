package brokerpage

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv/browser"
)

const project = "brokerpage-test"

type fixture struct {
	b    *broker.Broker
	srv  *httptest.Server
	addr string // the broker's
}

// start serves the page for a broker with a topic "orders" and its
// subscription "orders-sub", in process, with a subscription of a name as
// long as the tutorial's.
func start(t *testing.T) fixture {
	t.Helper()
	b, err := broker.New(broker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	addr, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Topics and subscriptions are made through the broker's REST API, as
	// a user of the page might have made them with gcloud.
	for _, r := range []struct{ path, body string }{
		{"/topics/orders", `{}`},
		{"/subscriptions/orders-sub", `{"topic":"projects/` + project + `/topics/orders","ackDeadlineSeconds":10}`},
		{"/topics/topicFromDataflow", `{}`},
		{"/subscriptions/topicFromDataflow.subscriptionFromDataflow", `{"topic":"projects/` + project +
			`/topics/topicFromDataflow","filter":"attributes.origin = \"dedupflow-pipeline-output\""}`},
	} {
		req, _ := http.NewRequest("PUT", "http://"+addr+"/v1/projects/"+project+r.path, strings.NewReader(r.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("create %s: %v %v", r.path, resp, err)
		}
		resp.Body.Close()
	}
	h, err := New(b, Options{ConsoleURL: "/"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return fixture{b: b, srv: srv, addr: addr}
}

// TestBrokerPageBrowser drives the page from real Chromium: the live table,
// publishing with attributes, peeking (which takes nothing), seeking, and a
// payload that must stay text.
func TestBrokerPageBrowser(t *testing.T) {
	f := start(t)
	ctx, cancel := context.WithTimeout(browser.New(t), 60*time.Second)
	defer cancel()
	tab := &browser.Tab{T: t, Ctx: ctx}
	tab.Report = func() string {
		return "table: " + tab.Eval(`document.getElementById("subs").innerText`) + "\nstatus: " +
			tab.Eval(`["publish-status","seek-status","peek-status"].map(i => document.getElementById(i).textContent).join(" | ")`)
	}
	do, eval, waitPage := tab.Do, tab.Eval, tab.Wait
	sub := "projects/" + project + "/subscriptions/orders-sub"
	cellOf := func(field string) string {
		return `document.querySelector('tr[data-sub="` + sub + `"] td[data-field="` + field + `"]').textContent`
	}

	do("open the page", chromedp.Navigate(f.srv.URL+"/broker"))
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
	if got := eval(`document.getElementById("console-link").getAttribute("href")`); got != "/" {
		t.Errorf("link back to the console: %q", got)
	}
	if got := eval(`getComputedStyle(document.querySelector("section")).borderRadius`); got != "8px" {
		t.Errorf("sections have border radius %q, want the console's panels (8px)", got)
	}

	// Publish markup with attributes: it arrives, and stays text.
	const payload = `<img src=x onerror=alert(1)><script>alert(2)</script>`
	do("publish", chromedp.SetValue(chromedp.CSS("#pub-topic"), "projects/"+project+"/topics/orders"),
		chromedp.SetValue(chromedp.CSS("#pub-data"), payload),
		chromedp.SetValue(chromedp.CSS("#pub-attrs"), "origin=<b>page</b>\nkind=test"),
		chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the publish", `document.getElementById("publish-status").textContent.startsWith("Published")`)
	waitPage("the backlog to show it", cellOf("backlog")+` === "1"`)

	// Peek shows it and leaves it there.
	do("peek", chromedp.Click(chromedp.CSS(`tr[data-sub="`+sub+`"] button.peek`)))
	waitPage("the peeked message", `document.querySelectorAll("#peek tbody tr").length === 1`)
	if got := eval(`document.querySelector("#peek tbody tr td.data").textContent`); got != payload {
		t.Fatalf("peeked data %q, want %q as text", got, payload)
	}
	if got := eval(`document.querySelectorAll("#peek tbody tr td.data")[1].textContent`); got != "kind=test\norigin=<b>page</b>" {
		t.Fatalf("peeked attributes %q", got)
	}
	if n := eval(`String(document.querySelectorAll("main img, main b, main script").length)`); n != "0" {
		t.Fatalf("the payload became %s elements", n)
	}
	msgs, err := f.b.Peek(sub, 10)
	if err != nil || len(msgs) != 1 || msgs[0].Attributes["origin"] != "<b>page</b>" {
		t.Fatalf("after peeking, the broker holds %v, %v; want the message, untaken", msgs, err)
	}

	// A bad attribute line and a publish the broker refuses say why.
	do("publish a bad attribute", chromedp.SetValue(chromedp.CSS("#pub-attrs"), "no equals sign"), chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the attribute error", `document.getElementById("publish-status").textContent.includes("want key=value")`)
	do("publish a reserved attribute", chromedp.SetValue(chromedp.CSS("#pub-attrs"), "googkey=1"), chromedp.Click(chromedp.CSS("#pub-send")))
	waitPage("the broker's refusal", `document.getElementById("publish-status").classList.contains("bad") && document.getElementById("publish-status").textContent.includes("goog")`)

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

// TestBrokerPageGuards: the state-changing endpoints take only the page's
// own requests, and the page answers only to local host names.
func TestBrokerPageGuards(t *testing.T) {
	f := start(t)
	form := url.Values{"topic": {"projects/" + project + "/topics/orders"}, "data": {"x"}}.Encode()
	for _, tc := range []struct {
		name, method, path, host string
		header                   map[string]string
		want                     int
	}{
		{"no token", "POST", "/broker/api/publish", "", nil, 403},
		{"cross-site", "POST", "/broker/api/publish", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"peek without token", "GET", "/broker/api/peek?subscription=projects/" + project + "/subscriptions/orders-sub", "", nil, 403},
		{"rebound host", "GET", "/broker", "evil.example", nil, 421},
		{"page", "GET", "/broker", "", nil, 200},
		{"shared stylesheet", "GET", "/broker/static/style.css", "", nil, 200},
		{"own stylesheet", "GET", "/broker/static/broker.css", "", nil, 200},
		{"no listing", "GET", "/broker/static/", "", nil, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, f.srv.URL+tc.path, strings.NewReader(form))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			if tc.host != "" {
				req.Host = tc.host
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.want)
			}
		})
	}
	if msgs, _ := f.b.Peek("projects/"+project+"/subscriptions/orders-sub", 10); len(msgs) != 0 {
		t.Fatalf("a refused publish got through: %v", msgs)
	}
}

// TestBrokerPageTransforms: the page's state lists a topic's transforms
// with the messages each filtered and failed.
func TestBrokerPageTransforms(t *testing.T) {
	f := start(t)
	udf := `{"messageTransforms":[{"javascriptUdf":{"functionName":"drop","code":"function drop(m) { return m.data === \"test\" ? null : m; }"}}]}`
	addr := f.addr
	req, _ := http.NewRequest("PUT", "http://"+addr+"/v1/projects/"+project+"/topics/filtered", strings.NewReader(udf))
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("create topic: %v %v", resp, err)
	}
	resp.Body.Close()
	// "dGVzdA==" is "test", filtered out; "b2s=" is "ok".
	resp, err = http.Post("http://"+addr+"/v1/projects/"+project+"/topics/filtered:publish", "application/json",
		strings.NewReader(`{"messages":[{"data":"dGVzdA=="},{"data":"b2s="}]}`))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("publish: %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(f.srv.URL + "/broker/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct{ Topics []topicView }
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	for _, tv := range state.Topics {
		if strings.HasSuffix(tv.Name, "/topics/filtered") {
			if len(tv.Transforms) != 1 || tv.Transforms[0] != (transformView{Function: "drop", Filtered: 1}) {
				t.Errorf("transforms %+v, want drop with 1 filtered", tv.Transforms)
			}
			return
		}
	}
	t.Fatalf("topic not on the page: %+v", state.Topics)
}
