// Package brokertest starts the embedded broker for tests, the one way every
// package's tests start it in process. It is a package of its own, not part
// of testenv, because the broker's own tests import testenv.
package brokertest

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// Start starts an in-memory broker on a free loopback port, closed when t
// ends, and returns its host:port.
func Start(t testing.TB) string {
	t.Helper()
	_, addr := StartWith(t, broker.Options{})
	return addr
}

// Ours is Start in the form testenv.EmulatorAndOurs takes.
func Ours(t *testing.T) string {
	t.Helper()
	return Start(t)
}

// StartWith is Start with opts, also returning the broker, for a test that
// sets its clock or closes it under a command.
func StartWith(t testing.TB, opts broker.Options) (*broker.Broker, string) {
	t.Helper()
	b, err := broker.New(opts)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	t.Cleanup(func() { _ = b.Close() })
	addr, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	return b, addr
}

// Dial is a client for project on the broker at addr, closed when t ends.
func Dial(t testing.TB, addr, project string) *pubsub.Client {
	t.Helper()
	c, err := pubsubio.NewClient(context.Background(), project, pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// CreateOrders makes, through the broker's REST API as a user of gcloud
// would, a topic "orders" with its subscription "orders-sub", and a
// subscription whose name is as long as the tutorial's, on which a page's
// layout is checked.
func CreateOrders(t testing.TB, addr, project string) {
	t.Helper()
	for _, r := range []struct{ path, body string }{
		{"/topics/orders", `{}`},
		{"/subscriptions/orders-sub", `{"topic":"projects/` + project + `/topics/orders","ackDeadlineSeconds":10}`},
		{"/topics/topicFromDataflow", `{}`},
		{"/subscriptions/topicFromDataflow.subscriptionFromDataflow", `{"topic":"projects/` + project +
			`/topics/topicFromDataflow","filter":"attributes.origin = \"dedupflow-pipeline-output\""}`},
	} {
		req, err := http.NewRequest("PUT", "http://"+addr+"/v1/projects/"+project+r.path, strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("create %s: %v", r.path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("create %s: %s", r.path, resp.Status)
		}
	}
}
