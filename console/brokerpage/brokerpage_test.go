package brokerpage

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
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
	b, addr := brokertest.StartWith(t, broker.Options{})
	brokertest.CreateOrders(t, addr, project)
	h, err := New(b, Options{ConsoleURL: "/"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return fixture{b: b, srv: srv, addr: addr}
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
