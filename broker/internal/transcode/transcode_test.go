package transcode

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestRoutesFromDescriptors checks that every RPC the services annotate
// with a REST binding is routed, and the streaming one is not.
func TestRoutesFromDescriptors(t *testing.T) {
	rs, err := routes([]Service{
		{Desc: &pb.Publisher_ServiceDesc}, {Desc: &pb.Subscriber_ServiceDesc}, {Desc: &pb.SchemaService_ServiceDesc},
		{Desc: &iampb.IAMPolicy_ServiceDesc, More: map[string][]*annotations.HttpRule{
			"GetIamPolicy": {{Pattern: &annotations.HttpRule_Get{Get: "/v1/{resource=**}:getIamPolicy"}}},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	for _, r := range rs {
		got[string(r.rpc.Name())] = append(got[string(r.rpc.Name())], r.verb)
	}
	for rpc, verb := range map[string]string{
		"CreateTopic": "PUT", "Publish": "POST", "UpdateTopic": "PATCH", "DeleteTopic": "DELETE",
		"Pull": "POST", "Acknowledge": "POST", "ModifyAckDeadline": "POST", "ModifyPushConfig": "POST",
		"Seek": "POST", "CreateSnapshot": "PUT", "ListSnapshots": "GET", "DetachSubscription": "POST",
		"ListSchemaRevisions": "GET",
	} {
		if len(got[rpc]) != 1 || got[rpc][0] != verb {
			t.Errorf("%s: routed as %v, want %s", rpc, got[rpc], verb)
		}
	}
	if v := strings.Join(got["GetIamPolicy"], ","); v != "POST,GET" {
		t.Errorf("GetIamPolicy: routed as %s, want the descriptor's POST and the added GET", v)
	}
	if _, ok := got["StreamingPull"]; ok {
		t.Error("StreamingPull has no REST binding but was routed")
	}
}

// publisher answers GetTopic for topics named "t" and Publish with one ID
// per message; the rest is the generated "unimplemented".
type publisher struct {
	pb.UnimplementedPublisherServer
}

func (publisher) GetTopic(_ context.Context, req *pb.GetTopicRequest) (*pb.Topic, error) {
	if !strings.HasSuffix(req.Topic, "/topics/t") {
		return nil, status.Errorf(codes.NotFound, "Resource not found (resource=%s).", req.Topic)
	}
	return &pb.Topic{Name: req.Topic, State: pb.Topic_ACTIVE, Labels: map[string]string{"a": "b"}}, nil
}

func (publisher) Publish(_ context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	resp := &pb.PublishResponse{}
	for _, m := range req.Messages {
		resp.MessageIds = append(resp.MessageIds, string(m.Data))
	}
	return resp, nil
}

// TestHandler transcodes requests to a Publisher of its own: the path, the
// body and the system parameters fill the request and shape the answer,
// and errors are the service's JSON.
func TestHandler(t *testing.T) {
	var firstSaw []string
	h, err := NewHandler([]Service{{Desc: &pb.Publisher_ServiceDesc, Impl: publisher{}}},
		func(w http.ResponseWriter, r *http.Request, segs []string) bool {
			firstSaw = segs
			return false
		})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(KeepSemicolons(h))
	t.Cleanup(srv.Close)
	call := func(method, path, body string) (int, string, http.Header) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		out, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(out), resp.Header
	}
	for _, c := range []struct {
		name, method, path, body string
		code                     int
		want                     string
	}{
		{"get", "GET", "/v1/projects/p/topics/t", "", 200, `"state":"ACTIVE"`},
		{"enums as numbers, Java's spelling", "GET", "/v1/projects/p/topics/t?$alt=json;enum-encoding=int", "", 200, `"state":1`},
		{"fields", "GET", "/v1/projects/p/topics/t?fields=labels", "", 200, `"labels"`},
		{"publish", "POST", "/v1/projects/p/topics/t:publish", `{"messages":[{"data":"MQ=="},{"data":"Mg=="}]}`, 200, `"2"]`},
		{"not found", "GET", "/v1/projects/p/topics/u", "", 404, `"status":"NOT_FOUND"`},
		{"unknown field", "POST", "/v1/projects/p/topics/t:publish", `{"mesages":[]}`, 400, `"status":"INVALID_ARGUMENT"`},
		{"unimplemented", "GET", "/v1/projects/p/topics", "", 501, `"status":"UNIMPLEMENTED"`},
		{"no such path", "GET", "/v1/nothing", "", 404, `is not a method of the Pub/Sub v1 REST API`},
	} {
		code, body, _ := call(c.method, c.path, c.body)
		if code != c.code || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %s, want %d with %s", c.name, code, body, c.code, c.want)
		}
		if c.code >= 400 {
			var e struct{ Error struct{ Code int } }
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != c.code {
				t.Errorf("%s: error body %s, want the service's {\"error\":{\"code\":%d,...}}", c.name, body, c.code)
			}
		}
	}
	if strings.Join(firstSaw, "/") != "v1/nothing" {
		t.Errorf("the first handler saw %q, want each request's path segments", firstSaw)
	}
	if _, body, _ := call("GET", "/v1/projects/p/topics/t?fields=labels", ""); strings.Contains(body, "state") {
		t.Errorf("fields=labels answered %s, want the labels only", body)
	}
	code, _, hdr := call("POST", "/v1/projects/p/topics/t/subscriptions", "")
	if code != 404 || hdr.Get("Allow") != "GET" {
		t.Errorf("a path taken with another method: %d, Allow %q; want 404 and Allow GET", code, hdr.Get("Allow"))
	}
}
