package console

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

func TestValidate(t *testing.T) {
	long := strings.Repeat("k", limits.AttributeValueBytes+1)
	for _, tc := range []struct {
		name, message, key, copies string
		field, want                string // empty field: valid
	}{
		{"seed", "Message 1", "123", "", "", ""},
		{"no key", "Message 1", "", "1", "", ""},
		{"copies", "m", "k", "10", "", ""},
		{"empty message", "", "123", "", "message", "Enter a message"},
		{"long message", strings.Repeat("m", maxMessageBytes+1), "1", "", "message", "bytes"},
		{"bad utf8 message", "\xff", "1", "", "message", "UTF-8"},
		{"long key", "m", long, "", "key", "1024"},
		{"spaces", "m", " 123", "", "key", "spaces"},
		{"trailing space", "m", "123 ", "", "key", "spaces"},
		{"control", "m", "1\n2", "", "key", "control"},
		{"bad utf8 key", "m", "\xfe", "", "key", "UTF-8"},
		{"reserved key", "m", "message-id:5", "", "key", dedup.ErrKeyReserved.Error()},
		{"zero copies", "m", "k", "0", "copies", "1 to 10"},
		{"many copies", "m", "k", "11", "copies", "1 to 10"},
		{"word copies", "m", "k", "two", "copies", "whole number"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := validate(tc.message, tc.key, tc.copies)
			switch {
			case tc.field == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.field != "" && err == nil:
				t.Fatalf("accepted; want an error on %s", tc.field)
			case err != nil && (err.field != tc.field || !strings.Contains(err.msg, tc.want)):
				t.Fatalf("error %v; want field %s mentioning %q", err, tc.field, tc.want)
			}
		})
	}
}

// newTest returns a console on an in-memory broker with the tutorial's
// topics, and a client of that broker; change edits its options.
func newTest(t *testing.T, change ...func(*Options)) (*Console, *pubsub.Client) {
	t.Helper()
	c := brokertest.Dial(t, brokertest.Start(t), "p")
	ctx := context.Background()
	name := func(kind, id string) pubsubio.Name { return pubsubio.Name{Project: "p", Kind: kind, ID: id} }
	o := Options{
		Client:               c,
		InputTopic:           name("topics", "topicToDataflow"),
		PipelineSubscription: name("subscriptions", "pipe"),
		OutputTopic:          name("topics", "topicFromDataflow"),
		OutputSubscription:   name("subscriptions", "console"),
		IDAttribute:          "key",
		Horizon:              10 * time.Minute,
		Counts:               func() pipeline.Counts { return pipeline.Counts{Received: 3, DuplicateRepublish: 1} },
	}
	for _, f := range change {
		f(&o)
	}
	for _, tp := range []pubsubio.Name{o.InputTopic, o.OutputTopic} {
		if err := pubsubio.EnsureTopic(ctx, c, tp); err != nil {
			t.Fatal(err)
		}
	}
	if err := pubsubio.EnsureSubscription(ctx, c, o.PipelineSubscription, o.InputTopic, 10); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, o.OutputSubscription, o.OutputTopic, 10); err != nil {
		t.Fatal(err)
	}
	con, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return con, c
}

func TestPublishGuards(t *testing.T) {
	con, _ := newTest(t)
	h := con.Handler()
	form := url.Values{"message": {"Message 1"}, "key": {"123"}}.Encode()
	for _, tc := range []struct {
		name     string
		host     string
		body     string
		header   map[string]string
		code     int
		wantText string
	}{
		{"same origin", "", form, map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8080"}, 200, "message_ids"},
		{"no token", "", form, map[string]string{"X-CSRF-Token": ""}, 403, "token"},
		{"wrong token", "", form, map[string]string{"X-CSRF-Token": "0000"}, 403, "token"},
		{"cross site", "", form, map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "cross-site"},
		{"foreign origin", "", form, map[string]string{"Origin": "http://evil.example"}, 403, "cross-site"},
		{"rebound host", "evil.example:8080", form, nil, 421, "not served here"},
		{"too large", "", "message=" + strings.Repeat("a", maxBodyBytes), nil, 413, "larger than"},
		{"bad key", "", url.Values{"message": {"m"}, "key": {"123 "}}.Encode(), nil, 400, `"field":"key"`},
		{"localhost", "localhost:8080", form, nil, 200, "message_ids"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "http://127.0.0.1:8080/api/publish", strings.NewReader(tc.body))
			if tc.host != "" {
				r.Host = tc.host
			}
			r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			r.Header.Set("X-CSRF-Token", con.token)
			for k, v := range tc.header {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != tc.code || !strings.Contains(w.Body.String(), tc.wantText) {
				t.Errorf("got %d %s; want %d with %q", w.Code, w.Body, tc.code, tc.wantText)
			}
		})
	}
}

// TestDefaultIDAttribute: with no id attribute set, the form's key goes
// where dedupflow publish puts it, so both feed the same pipeline alike.
func TestDefaultIDAttribute(t *testing.T) {
	con, c := newTest(t, func(o *Options) { o.IDAttribute = "" })
	r := httptest.NewRequest("POST", "http://127.0.0.1:8080/api/publish",
		strings.NewReader(url.Values{"message": {"Message 1"}, "key": {"123"}}.Encode()))
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	r.Header.Set("X-CSRF-Token", con.token)
	w := httptest.NewRecorder()
	con.Handler().ServeHTTP(w, r)
	if w.Code != 200 {
		t.Fatalf("publish: %d %s", w.Code, w.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got map[string]string
	err := c.Subscriber(con.o.PipelineSubscription.String()).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		got = m.Attributes
		cancel()
	})
	if err != nil {
		t.Fatal(err)
	}
	if got[publisher.DefaultIDAttribute] != "123" {
		t.Errorf("published attributes %v: want the key in %s", got, publisher.DefaultIDAttribute)
	}
}

func TestPage(t *testing.T) {
	con, _ := newTest(t)
	w := httptest.NewRecorder()
	con.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080/", nil))
	body := w.Body.String()
	if w.Code != 200 || !strings.Contains(body, `content="`+con.token+`"`) || !strings.Contains(body, "horizon <strong id=\"horizon\">10m</strong>") {
		t.Errorf("page: %d, token or horizon missing:\n%s", w.Code, body)
	}
	// Message IDs count across topics, as the broker numbers them: the
	// page says why the output's skip numbers.
	if !strings.Contains(body, "skip the numbers") {
		t.Errorf("page: no word on why the output's message IDs skip numbers:\n%s", body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
		t.Errorf("CSP %q", csp)
	}
	for _, f := range []string{"/static/app.js", "/static/style.css"} {
		w := httptest.NewRecorder()
		con.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080"+f, nil))
		if w.Code != 200 || w.Body.Len() == 0 {
			t.Errorf("%s: %d", f, w.Code)
		}
	}
	// A folder is not listed.
	for _, f := range []string{"/static/"} {
		w := httptest.NewRecorder()
		con.Handler().ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1:8080"+f, nil))
		if w.Code != 404 {
			t.Errorf("%s: %d, want 404 (no listing):\n%s", f, w.Code, w.Body)
		}
	}
}

// TestServe: outputs reach the live view over SSE with the counters, and
// stopping Serve ends an open stream.
func TestServe(t *testing.T) {
	con, c := newTest(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- con.Serve(ctx, ln) }()

	resp, err := http.Get("http://" + ln.Addr().String() + "/api/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	pub := c.Publisher(con.o.OutputTopic.String())
	defer pub.Stop()
	const payload = `<b>Message 1</b>`
	if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(payload), Attributes: map[string]string{"key": "123", "event_time": "1700000000123"}}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	events := make(chan string)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		var ev string
		for sc.Scan() {
			line := sc.Text()
			switch {
			case strings.HasPrefix(line, "event: "):
				ev = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				events <- ev + " " + strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	var gotRow, gotCounts bool
	for !gotRow || !gotCounts {
		select {
		case e := <-events:
			switch {
			case strings.HasPrefix(e, "row "):
				var r Row
				if err := json.Unmarshal([]byte(strings.TrimPrefix(e, "row ")), &r); err != nil {
					t.Fatal(err)
				}
				if r.Data != payload || r.Key != "123" || r.MessageID == "" || r.EventTime != "2023-11-14T22:13:20.123Z" || r.EventTimeFrom != "attribute" {
					t.Errorf("row %+v", r)
				}
				gotRow = true
			case strings.HasPrefix(e, "counts "):
				if !strings.Contains(e, `"received":3`) || !strings.Contains(e, `"republish":1`) {
					t.Errorf("counts %s", e)
				}
				gotCounts = true
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("row %v, counts %v after 10s", gotRow, gotCounts)
		}
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve still running 10s after its context ended")
	}
	select {
	case _, open := <-events:
		for open {
			_, open = <-events
		}
	case <-time.After(5 * time.Second):
		t.Fatal("event stream still open after Serve returned")
	}
}

// TestEventsReset: a page that reconnects with an event ID of another run
// is told to reload; one of this run resumes after it.
func TestEventsReset(t *testing.T) {
	con, _ := newTest(t)
	con.feed.add(Row{Data: "a"})
	con.feed.add(Row{Data: "b"})
	for _, tc := range []struct{ last, want, not string }{
		{"old.1", "event: reset", "event: row"},
		{"garbage", "event: reset", "event: row"},
		{con.instance + ".1", `"data":"b"`, `"data":"a"`},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		r := httptest.NewRequestWithContext(ctx, "GET", "http://127.0.0.1:8080/api/events", nil)
		r.Header.Set("Last-Event-ID", tc.last)
		w := httptest.NewRecorder()
		con.Handler().ServeHTTP(w, r) // returns on reset, or when ctx ends
		cancel()
		if body := w.Body.String(); !strings.Contains(body, tc.want) || strings.Contains(body, tc.not) {
			t.Errorf("Last-Event-ID %s: %q; want %q and no %q", tc.last, body, tc.want, tc.not)
		}
	}
}

// The pipeline can emit a message before the console hears back from
// Publish: its output must still be traced to the submission (the row gets
// its Redeliver button), with or without a key.
func TestSubmissionOutputBeforePublishReturns(t *testing.T) {
	subs := newSubmissions(10)
	at := time.UnixMilli(1_700_000_000_000)
	keyed := subs.begin(at, "456")
	if got := subs.lookup(t.Context(), "456", at); got != keyed {
		t.Fatalf("keyed output while publishing: got %v, want submission %d", got, keyed.id)
	}

	keyless := subs.begin(at, "")
	found := make(chan *submission, 1)
	go func() { found <- subs.lookup(t.Context(), dedup.MessageIDKey("m-7"), at) }() // the output carries the ID in its namespace
	select {
	case got := <-found:
		t.Fatalf("keyless output resolved to %v before its message ID was known", got)
	case <-time.After(50 * time.Millisecond):
	}
	subs.finish(keyless, []string{"m-7"})
	subs.finish(keyed, []string{"m-5"})
	if got := <-found; got != keyless {
		t.Fatalf("keyless output: got %v, want submission %d", got, keyless.id)
	}

	// A submission none of whose copies was published is not remembered,
	// and an unrelated output does not wait for anything.
	failed := subs.begin(at.Add(time.Millisecond), "9")
	subs.finish(failed, nil)
	if subs.get(failed.id) != nil || subs.lookup(t.Context(), "9", failed.at) != nil {
		t.Error("a submission that published nothing is still remembered")
	}
	if got := subs.after(at); got != 2 {
		t.Errorf("messages published since the first submission: %d, want 2", got)
	}
}
