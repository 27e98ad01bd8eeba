package brokerpage

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

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

// state reads what the page shows, as its script does.
func (f fixture) state(t *testing.T) []topicView {
	t.Helper()
	resp, err := http.Get(f.srv.URL + "/broker/api/state")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var state struct{ Topics []topicView }
	if err := json.NewDecoder(resp.Body).Decode(&state); err != nil {
		t.Fatal(err)
	}
	return state.Topics
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
	topics := f.state(t)
	for _, tv := range topics {
		if strings.HasSuffix(tv.Name, "/topics/filtered") {
			if len(tv.Transforms) != 1 || tv.Transforms[0] != (transformView{Function: "drop", Filtered: 1}) {
				t.Errorf("transforms %+v, want drop with 1 filtered", tv.Transforms)
			}
			return
		}
	}
	t.Fatalf("topic not on the page: %+v", topics)
}

// TestBrokerPageStreams: a subscription's row counts the StreamingPull
// streams open on it, so a subscriber that is not reading shows as 0.
func TestBrokerPageStreams(t *testing.T) {
	f := start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := brokertest.Dial(t, f.addr, project)
	sub := "projects/" + project + "/subscriptions/orders-sub"
	streams := func() int {
		t.Helper()
		topics := f.state(t)
		for _, tv := range topics {
			for _, s := range tv.Subscriptions {
				if s.Name == sub {
					return s.Streams
				}
			}
		}
		t.Fatalf("%s not on the page: %+v", sub, topics)
		return 0
	}
	if n := streams(); n != 0 {
		t.Fatalf("%d streams before any subscriber, want 0", n)
	}
	if _, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: "projects/" + project + "/topics/orders",
		Messages: []*pb.PubsubMessage{{Data: []byte("order 1")}, {Data: []byte("order 2")}}}); err != nil {
		t.Fatal(err)
	}
	// One message each: a stream is open once it has delivered.
	for range 2 {
		st, err := c.SubscriptionAdminClient.StreamingPull(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&pb.StreamingPullRequest{Subscription: sub, StreamAckDeadlineSeconds: 60, MaxOutstandingMessages: 1}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if n := streams(); n != 2 {
		t.Fatalf("%d streams with two open, want 2", n)
	}
}

// TestBrokerPageExport: an export subscription shows where it writes, its
// state and why; here no Cloud Storage server is configured, so it says so
// and keeps its messages.
func TestBrokerPageExport(t *testing.T) {
	f := start(t)
	c := brokertest.Dial(t, f.addr, project)
	sub := "projects/" + project + "/subscriptions/to-gcs"
	if _, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{Name: sub,
		Topic: "projects/" + project + "/topics/orders", AckDeadlineSeconds: 60,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: "some-bucket"}}); err != nil {
		t.Fatal(err)
	}
	var got *exportView
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		for _, tv := range f.state(t) {
			for _, s := range tv.Subscriptions {
				if s.Name == sub {
					got = s.Export
				}
			}
		}
		if got != nil && got.State == "NOT_FOUND" {
			break
		}
	}
	if got == nil || got.Kind != "cloud_storage" || got.Destination != "gs://some-bucket" || got.State != "NOT_FOUND" ||
		!strings.Contains(got.Reason, "STORAGE_EMULATOR_HOST") {
		t.Fatalf("the page shows %+v, want the bucket, NOT_FOUND and that no Cloud Storage endpoint is set", got)
	}
}
