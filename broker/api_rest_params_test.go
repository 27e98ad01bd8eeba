package broker

import (
	"io"
	"net/http"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
)

// TestRESTSystemParams takes the system parameters in the spellings
// Google's clients send: Python's REST transport "%24alt=json%3Benum-encoding%3Dint",
// Java's bare "$alt=json;enum-encoding=int", gcloud's "alt=json", and the
// rest of the service's list with and without '$'; enum-encoding=int
// renders enums as numbers, fields selects, prettyPrint indents, alt=proto
// answers in the wire format.
func TestRESTSystemParams(t *testing.T) {
	base := "http://" + startOurs(t, Options{}).addr + "/v1/projects/" + project
	topic := unique("sys-t")
	if code, v := rest(t, "PUT", base+"/topics/"+topic, `{"labels":{"a":"b"}}`); code != 200 {
		t.Fatalf("create topic: %d %v", code, v)
	}
	get := func(t *testing.T, query string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + "/topics/" + topic + "?" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	for _, tc := range []struct{ name, query, want, wantNot string }{
		{"python", "%24alt=json%3Benum-encoding%3Dint", `"state":1`, `"ACTIVE"`},
		{"java", "$alt=json;enum-encoding=int", `"state":1`, `"ACTIVE"`},
		{"gcloud", "alt=json", `"state":"ACTIVE"`, ``},
		{"enum strings", "$alt=json;enum-encoding=string", `"state":"ACTIVE"`, ``},
		{"pretty", "prettyPrint=true", "{\n  \"", ``},
		{"pretty with $", "$prettyPrint=true&$alt=json", "\n", ``},
		{"not pretty", "prettyPrint=false", `{"name"`, "\n"},
		{"fields", "fields=name", `{"name":"projects/`, `labels`},
		{"$fields nested", "$fields=labels(a),state", `"labels":{"a":"b"}`, `"name"`},
		{"fields in proto spelling", "fields=message_retention_duration,name", `"name"`, `"state"`},
		{"error format", "$.xgafv=2", `"name"`, ``},
		{"credentials and quota", "key=k&$key=k&access_token=t&oauth_token=t&quotaUser=q&$quotaUser=q&$userProject=p", `"name"`, ``},
		{"uploads and JSONP", "upload_protocol=raw&uploadType=media&callback=cb&$callback=cb", `{"name"`, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := get(t, tc.query)
			if code != 200 || !strings.Contains(body, tc.want) || (tc.wantNot != "" && strings.Contains(body, tc.wantNot)) {
				t.Fatalf("?%s: %d %s, want 200 with %q and without %q", tc.query, code, body, tc.want, tc.wantNot)
			}
		})
	}
	t.Run("proto", func(t *testing.T) {
		code, body := get(t, "$alt=proto")
		var tp pb.Topic
		if err := proto.Unmarshal([]byte(body), &tp); code != 200 || err != nil || tp.Labels["a"] != "b" {
			t.Fatalf("alt=proto: %d, %v, %v", code, err, &tp)
		}
	})
	// A POST binds its body, not the query, yet reads the system parameters.
	code, v := rest(t, "POST", base+"/topics/"+topic+":publish?%24alt=json%3Benum-encoding%3Dint", `{"messages":[{"data":"aGk="}]}`)
	if code != 200 || len(v["messageIds"].([]any)) != 1 {
		t.Fatalf("publish with $alt: %d %v", code, v)
	}
	for _, tc := range []struct{ query, msg string }{
		{"$alt=xml", "alt=json or alt=proto"},
		{"alt=json;enum-encoding=roman", `unknown option "enum-encoding=roman"`},
		{"$prettyPrint=maybe", "want true or false"},
		{"$.xgafv=3", "error format is 1 or 2"},
		{"fields=labels(a", "unclosed ("},
		{"$foo=1", `Unknown name "$foo"`},
		{"%zz=1", "query parameter"},
	} {
		code, v := rest(t, "GET", base+"/topics/"+topic+"?"+tc.query, ``)
		e, _ := v["error"].(map[string]any)
		if code != 400 || e["status"] != "INVALID_ARGUMENT" || !strings.Contains(e["message"].(string), tc.msg) {
			t.Errorf("?%s: %d %v, want 400 INVALID_ARGUMENT containing %q", tc.query, code, v, tc.msg)
		}
	}
}
