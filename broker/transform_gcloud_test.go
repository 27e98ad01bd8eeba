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
	gcloud := testenv.Tool(t, "gcloud")
	ours := startOurs(t, Options{Now: time.Now})
	dir := t.TempDir()
	file := func(name, fn, code string) string {
		b, err := json.Marshal([]map[string]any{{"javascriptUdf": map[string]string{"functionName": fn, "code": code}}})
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
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
