package broker

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestTransformGcloud: gcloud's --message-transforms-file sets a topic's
// and a subscription's UDFs over REST, and what gcloud pulls is transformed;
// code that does not parse is refused at create.
func TestTransformGcloud(t *testing.T) {
	t.Parallel()
	gcloud := testenv.Tool(t, "gcloud")
	ours := startOurs(t, Options{Now: time.Now})
	dir := t.TempDir()
	file := func(name, fn, code string) string {
		return writeJSON(t, dir, name, []map[string]any{udfJSON(fn, code)})
	}
	up := file("up.json", "up", udfUpper)
	drop := file("drop.json", "drop", udfDrop)
	bad := file("bad.json", "f", "function f(m) {")
	out := runGcloud(t, gcloud, ours.addr, unique("gcloud"), [][]string{
		{"topics", "create", "tx-topic", "--message-transforms-file", drop},
		{"subscriptions", "create", "tx-sub", "--topic", "tx-topic", "--message-transforms-file", up},
		{"topics", "publish", "tx-topic", "--message", "dropped", "--attribute", "drop=yes"},
		{"topics", "publish", "tx-topic", "--message", "hello"},
		{"subscriptions", "pull", "tx-sub", "--auto-ack", "--limit", "10", "--format", "json(message.data,message.attributes)"},
		{"topics", "describe", "tx-topic", "--format", "value(messageTransforms[0].javascriptUdf.functionName)"},
		{"topics", "create", "tx-bad", "--message-transforms-file", bad},
	})
	for _, want := range []string{
		"SEVMTE8=",             // HELLO
		`"transformed": "yes"`, // the subscription's UDF ran
		"\ndrop\n",             // stored and described
		"Failed to create topic [projects/PROJECT/topics/tx-bad]: message_transforms[0].javascript_udf: code does not parse",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("gcloud output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "ZHJvcHBlZA==") || strings.Contains(out, "RFJPUFBFRA==") {
		t.Errorf("the filtered message was pulled:\n%s", out)
	}
}

// TestTransformCallsGcloud: gcloud's message-transforms validate and test,
// the service's REST calls for trying UDFs before setting them: valid and
// invalid code, a message upper-cased, filtered out and failed, and a
// topic's own transforms tried by name.
func TestTransformCallsGcloud(t *testing.T) {
	t.Parallel()
	gcloud := testenv.Tool(t, "gcloud")
	ours := startOurs(t, Options{Now: time.Now})
	dir := t.TempDir()
	js := udfJSON
	one := func(name, fn, code string) string { return writeJSON(t, dir, name, js(fn, code)) }
	list := func(name string, ts ...map[string]any) string { return writeJSON(t, dir, name, ts) }
	out := runGcloud(t, gcloud, ours.addr, unique("gcloud"), [][]string{
		{"message-transforms", "validate", "--message-transform-file", one("ok.json", "up", udfUpper)},
		{"message-transforms", "validate", "--message-transform-file", one("bad.json", "f", "function f(m) {")},
		{"message-transforms", "validate", "--message-transform-file", one("nofn.json", "g", udfUpper)},
		{"message-transforms", "test", "--message", "hello", "--message-transforms-file",
			list("updrop.json", js("up", udfUpper), js("drop", udfDrop)), "--format", "json"},
		{"message-transforms", "test", "--message", "gone", "--attribute", "drop=yes", "--message-transforms-file",
			list("dropup.json", js("drop", udfDrop), js("up", udfUpper)), "--format", "json"},
		{"message-transforms", "test", "--message", "x", "--message-transforms-file", list("boom.json", js("boom", udfThrow)), "--format", "json"},
		{"topics", "create", "tx-topic", "--message-transforms-file", list("up.json", js("up", udfUpper))},
		{"message-transforms", "test", "--message", "from topic", "--topic", "tx-topic", "--format", "json"},
		{"message-transforms", "test", "--message", "y", "--topic", "no-such-topic"},
	})
	for _, want := range []string{
		"Message transform is valid.",
		"message_transforms[0].javascript_udf: code does not parse",
		`code has no function named "g"`,
		`"data": "HELLO"`, // the upper-casing step, then drop kept it
		`"transformed": "yes"`,
		`"filteredMessage": {}`,
		`"message": "message transform boom failed: the function threw: Error: no x"`,
		`"data": "FROM TOPIC"`,
		"not found: topic not found: projects/PROJECT/topics/no-such-topic",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("gcloud output lacks %q:\n%s", want, out)
		}
	}
	if strings.Count(out, `"data": "HELLO"`) != 2 {
		t.Errorf("want the message after each of the two transforms:\n%s", out)
	}
	if strings.Contains(out, `"data": "GONE"`) {
		t.Errorf("a transform after the one that filtered the message ran:\n%s", out)
	}
}

// udfJSON is a JavaScript UDF transform as gcloud's transform files hold it.
func udfJSON(fn, code string) map[string]any {
	return map[string]any{"javascriptUdf": map[string]string{"functionName": fn, "code": code}}
}

// writeJSON writes v as JSON to dir/name and returns the path.
func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
