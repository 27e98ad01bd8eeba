package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/transcode"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// rest sends one request to a server's REST API and returns the status and
// the decoded JSON body.
func rest(t testing.TB, method, url, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
		if header[i] == "Host" {
			req.Host = header[i+1]
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatalf("%s %s: %d, body is not JSON: %q", method, url, resp.StatusCode, raw)
	}
	return resp.StatusCode, v
}

// TestRESTErrors checks the error bodies: the service's shape, HTTP status
// and status name; where the emulator answers with JSON too, the same
// status as the emulator.
func TestRESTErrors(t *testing.T) {
	ours := "http://" + startOurs(t, Options{}).addr
	emu := "http://" + testenv.EmulatorHost(t)
	topic, sub := unique("rest-t"), unique("rest-s")
	for _, base := range []string{ours, emu} {
		p := base + "/v1/projects/" + project
		if code, v := rest(t, "PUT", p+"/topics/"+topic, `{}`); code != 200 {
			t.Fatalf("create topic: %d %v", code, v)
		}
		if code, v := rest(t, "PUT", p+"/subscriptions/"+sub, `{"topic":"projects/`+project+`/topics/`+topic+`"}`); code != 200 {
			t.Fatalf("create subscription: %d %v", code, v)
		}
	}
	for _, tc := range []struct {
		name, method, path, body string
		header                   []string
		code                     int
		status, msg              string
		likeEmulator             bool
	}{
		{"exists", "PUT", "/topics/" + topic, `{}`, nil, 409, "ALREADY_EXISTS", "already exists", true},
		{"not found", "GET", "/topics/" + unique("none"), ``, nil, 404, "NOT_FOUND", "not found", true},
		{"unknown field", "PUT", "/topics/" + unique("t"), `{"nmae":"x"}`, nil, 400, "INVALID_ARGUMENT", `unknown field "nmae"`, true},
		{"malformed JSON", "PUT", "/topics/" + unique("t"), `{"labels":`, nil, 400, "INVALID_ARGUMENT", "Invalid JSON payload", true},
		{"wrong type", "PUT", "/topics/" + unique("t"), `{"labels":5}`, nil, 400, "INVALID_ARGUMENT", "unexpected token 5", true},
		{"data not base64", "POST", "/topics/" + topic + ":publish", `{"messages":[{"data":"!!!"}]}`, nil, 400, "INVALID_ARGUMENT", "data", true},
		{"short ID", "PUT", "/topics/ab", `{}`, nil, 400, "INVALID_ARGUMENT", "invalid topic name", true},
		{"verb on a GET path", "GET", "/topics/" + topic + ":publish", ``, nil, 400, "INVALID_ARGUMENT", "invalid topic name", true},
		{"empty publish", "POST", "/topics/" + topic + ":publish", `{"messages":[]}`, nil, 400, "INVALID_ARGUMENT", "at least one message", false},
		{"wrong method", "POST", "/topics/" + topic, `{}`, nil, 404, "NOT_FOUND", "this path takes DELETE, GET, PATCH, PUT", false},
		{"no such path", "GET", "/nothing/here", ``, nil, 404, "NOT_FOUND", "not a method", false},
		{"bad query value", "GET", "/topics?pageSize=many", ``, nil, 400, "INVALID_ARGUMENT", "Invalid value at 'pageSize' (TYPE_INT32)", false},
		{"unknown query parameter", "GET", "/topics?pagesize=1", ``, nil, 400, "INVALID_ARGUMENT", `Unknown name "pagesize"`, false},
		{"ack deadline out of range", "PUT", "/subscriptions/" + unique("s"), `{"topic":"projects/` + project + `/topics/` + topic + `","ackDeadlineSeconds":5}`, nil, 400, "INVALID_ARGUMENT", "ack_deadline_seconds", false},
		{"cross-site page", "POST", "/topics/" + topic + ":publish", `{"messages":[{"data":"aGk="}]}`, []string{"Sec-Fetch-Site", "cross-site"}, 403, "PERMISSION_DENIED", "cross-site", false},
		{"foreign origin", "DELETE", "/topics/" + topic, ``, []string{"Origin", "http://evil.example"}, 403, "PERMISSION_DENIED", "cross-site", false},
		{"rebound host name", "GET", "/topics/" + topic, ``, []string{"Host", "evil.example"}, 421, "PERMISSION_DENIED", "not served here", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, v := rest(t, tc.method, ours+"/v1/projects/"+project+tc.path, tc.body, tc.header...)
			e, _ := v["error"].(map[string]any)
			if code != tc.code || e["status"] != tc.status || e["code"] != float64(tc.code) ||
				!strings.Contains(e["message"].(string), tc.msg) {
				t.Fatalf("got %d %v, want %d {code: %d, status: %s, message containing %q}", code, v, tc.code, tc.code, tc.status, tc.msg)
			}
			if !tc.likeEmulator {
				return
			}
			ecode, ev := rest(t, tc.method, emu+"/v1/projects/"+project+tc.path, tc.body)
			if ee, _ := ev["error"].(map[string]any); ecode != code || ee["status"] != e["status"] {
				t.Fatalf("ours answered %d %v, the emulator %d %v", code, v, ecode, ev)
			}
		})
	}
	// The site checks do not keep the broker from its own clients, and
	// the guarded topic is still there.
	if code, v := rest(t, "GET", ours+"/v1/projects/"+project+"/topics/"+topic, ``, "Host", "localhost"); code != 200 {
		t.Fatalf("get topic as localhost: %d %v", code, v)
	}
}

// TestRESTAllowedHosts lets a name in that the user allowed.
func TestRESTAllowedHosts(t *testing.T) {
	base := "http://" + startOurs(t, Options{AllowedHosts: []string{"pubsub.test"}}).addr + "/v1/projects/" + project + "/topics"
	if code, v := rest(t, "GET", base, ``, "Host", "pubsub.test:8085"); code != 200 {
		t.Fatalf("allowed host refused: %d %v", code, v)
	}
	if code, _ := rest(t, "GET", base, ``, "Host", "other.test:8085"); code != 421 {
		t.Fatalf("other host: %d, want 421", code)
	}
}

// TestRESTAndGRPCShareState publishes over one protocol and pulls over the
// other, through the same port.
func TestRESTAndGRPCShareState(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	base := "http://" + tg.addr + "/v1/"
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic}).Name

	// REST in, gRPC out.
	code, v := rest(t, "POST", base+topic+":publish", `{"messages":[{"data":"aGVsbG8=","attributes":{"via":"rest"},"orderingKey":""}]}`)
	if code != 200 {
		t.Fatalf("REST publish: %d %v", code, v)
	}
	id := v["messageIds"].([]any)[0].(string)
	got := pullOne(t, c, sub, 5*time.Second)
	if got.Message.MessageId != id || string(got.Message.Data) != "hello" || got.Message.Attributes["via"] != "rest" {
		t.Fatalf("gRPC pulled %v, want message %s published over REST", got.Message, id)
	}
	if err := c.SubscriptionAdminClient.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: sub, AckIds: []string{got.AckId}}); err != nil {
		t.Fatal(err)
	}

	// gRPC in, REST out, with the JSON mapping of times and bytes.
	ids := publish(t, c, topic, &pubsub.Message{Data: []byte{0xff, 0x00}, Attributes: map[string]string{"via": "grpc"}})
	code, v = rest(t, "POST", base+sub+":pull", `{"maxMessages":10}`)
	if code != 200 {
		t.Fatalf("REST pull: %d %v", code, v)
	}
	msgs, _ := v["receivedMessages"].([]any)
	if len(msgs) != 1 {
		t.Fatalf("REST pull got %v, want the one message published over gRPC", v)
	}
	rm := msgs[0].(map[string]any)
	m := rm["message"].(map[string]any)
	if m["messageId"] != ids[0] || m["data"] != "/wA=" || m["attributes"].(map[string]any)["via"] != "grpc" {
		t.Fatalf("REST pulled %v, want message %s with data /wA=", m, ids[0])
	}
	if _, err := time.Parse(time.RFC3339Nano, m["publishTime"].(string)); err != nil {
		t.Fatalf("publishTime is not RFC 3339: %v", err)
	}
	if code, v := rest(t, "POST", base+sub+":acknowledge", `{"ackIds":["`+rm["ackId"].(string)+`"]}`); code != 200 {
		t.Fatalf("REST ack: %d %v", code, v)
	}
	// The REST ack reached the state gRPC reads: nothing is left to pull.
	r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
	if err != nil || len(r.ReceivedMessages) != 0 {
		t.Fatalf("after the REST ack, gRPC pulled %v, %v; want nothing", r, err)
	}
	// Lists and nested path fields (UpdateTopic binds topic.name).
	code, v = rest(t, "PATCH", base+topic, `{"topic":{"labels":{"team":"a"}},"updateMask":"labels"}`)
	if code != 200 || v["labels"].(map[string]any)["team"] != "a" {
		t.Fatalf("REST update topic: %d %v", code, v)
	}
	code, v = rest(t, "GET", base+"projects/"+project+"/topics/"+strings.TrimPrefix(topic, "projects/"+project+"/topics/")+"/subscriptions?pageSize=5", ``)
	if code != 200 || len(v["subscriptions"].([]any)) != 1 || v["subscriptions"].([]any)[0] != sub {
		t.Fatalf("REST list topic subscriptions: %d %v", code, v)
	}
}

// TestRESTGzipBody takes request bodies the way Google's Java API clients
// (Beam's PubsubIO) send them, gzipped, and refuses a body that unpacks past
// the bound or an encoding it cannot read with the service's error.
func TestRESTGzipBody(t *testing.T) {
	base := "http://" + startOurs(t, Options{}).addr + "/v1/projects/" + project
	gz := func(b []byte) string {
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		if _, err := zw.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := zw.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.String()
	}
	topic := unique("gzip-t")
	if code, v := rest(t, "PUT", base+"/topics/"+topic, gz([]byte(`{"labels":{"from":"java"}}`)), "Content-Encoding", "gzip"); code != 200 {
		t.Fatalf("create topic with a gzipped body: %d %v", code, v)
	}
	if code, v := rest(t, "GET", base+"/topics/"+topic, ``); code != 200 || v["labels"].(map[string]any)["from"] != "java" {
		t.Fatalf("the topic a gzipped body created: %d %v, want label from=java", code, v)
	}
	big := gz([]byte(`{"messages":[{"data":"` + strings.Repeat("A", transcode.BodyBytes) + `"}]}`))
	for _, tc := range []struct {
		name, body, encoding, msg string
	}{
		{"not gzip", `{}`, "gzip", "read gzip request body"},
		{"unpacks too large", big, "gzip", "unpacks to more than"},
		{"unknown encoding", `{}`, "br", `unsupported request Content-Encoding "br"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, v := rest(t, "POST", base+"/topics/"+topic+":publish", tc.body, "Content-Encoding", tc.encoding)
			e, _ := v["error"].(map[string]any)
			if code != 400 || e["status"] != "INVALID_ARGUMENT" || !strings.Contains(e["message"].(string), tc.msg) {
				t.Fatalf("got %d %v, want 400 INVALID_ARGUMENT containing %q", code, v, tc.msg)
			}
		})
	}
}
