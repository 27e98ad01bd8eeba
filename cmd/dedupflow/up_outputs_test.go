package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
)

// TestUpDeadLetters: a message the pipeline cannot use goes aside with the
// reason, and the banner's own command reads it; it does not come back for
// ever.
func TestUpDeadLetters(t *testing.T) {
	u := startUp(t, "--timestamp-attribute", "ts")
	cmd := waitFor(t, "dead-letter command", u.stdout, u.stderr,
		regexp.MustCompile(`cannot use go to \S+, with the reason:\n\s+dedupflow (subscribe [^\n]+)`), nil)
	id := u.publish(t, &pubsub.Message{Data: []byte("order 1"), Attributes: map[string]string{"key": "o-1", "ts": "yesterday"}})[0]

	t.Setenv("PUBSUB_EMULATOR_HOST", u.brokerAddr)
	var out, errs testenv.Buffer
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := run(sctx, append(strings.Fields(cmd), "--count", "1", "--json"), &out, &errs); err != nil {
		t.Fatalf("%s: %v\n%s", cmd, err, errs.String())
	}
	var got struct {
		Data       string            `json:"data"`
		Attributes map[string]string `json:"attributes"`
	}
	if err := json.Unmarshal([]byte(out.String()), &got); err != nil {
		t.Fatalf("%s printed %q: %v", cmd, out.String(), err)
	}
	if got.Data != "order 1" || got.Attributes[pipeline.AttrSourceMessageID] != id ||
		!strings.Contains(got.Attributes[pipeline.AttrError], "ts") {
		t.Errorf("dead letter %+v; want message %s with the reason naming attribute ts", got, id)
	}
}

// TestUpTableSink: with a table sink, the banner and the console name the
// table, and the console says why its list of arrivals stays empty.
func TestUpTableSink(t *testing.T) {
	pg := testenv.PostgresURL(t)
	table := fmt.Sprintf("up_%d", time.Now().UnixNano())
	u := startUp(t, "--sink", pg, "--table", table)
	first := strings.SplitN(u.stdout.String(), "\n", 2)[0]
	if want := "-> dedup pipeline -> table " + table; !strings.HasSuffix(first, want) {
		t.Errorf("banner begins %q, want it to end with %q", first, want)
	}
	if out := u.stdout.String(); strings.Contains(out, upConsumerSub) || !strings.Contains(out, "nothing reaches "+upOutputTopic) {
		t.Errorf("banner:\n%s\nwant no subscription of %s to read, and that nothing reaches it", out, upOutputTopic)
	}
	page := testenv.Get(t, u.consoleURL)
	if !strings.Contains(page, `<code id="destination">table `+table+` of --sink postgres://`) || !strings.Contains(page, `id="not-here"`) ||
		!strings.Contains(page, `id="empty" class="hint" hidden`) {
		t.Errorf("the console does not name table %s as where survivors go, nor why nothing arrives on %s:\n%s", table, upOutputTopic, page)
	}
}
