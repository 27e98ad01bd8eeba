package pipeline_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// An output the topic refuses for good goes to the dead-letter topic as it
// came in, and its key is released: a later copy is written.
func TestPermanentSinkErrorDeadLetters(t *testing.T) {
	var outTopic atomic.Value
	outTopic.Store("")
	var refuse atomic.Bool
	refuse.Store(true)
	_, conn := newPstest(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(func(req any) (bool, any, error) {
		if r := req.(*pubsubpb.PublishRequest); r.Topic == outTopic.Load().(string) && refuse.Load() {
			return true, nil, status.Error(codes.InvalidArgument, "injected: message refused")
		}
		return false, nil, nil
	})})
	r := newRig(t, conn, rigOpts{deadLetter: true, cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}, OutputIDAttribute: "dedup_key"}})
	outTopic.Store(r.out.String())
	r.start()
	id := r.publish("refused", map[string]string{"key": "k1"})
	r.waitCounts("dead letter", func(c pipeline.Counts) bool { return c.DeadLettered == 1 })
	dl := r.drain(r.dlSub, 1, 200*time.Millisecond)
	if len(dl) != 1 || dl[0].attrs[pipeline.AttrSourceMessageID] != id || !strings.Contains(dl[0].attrs[pipeline.AttrError], "message refused") {
		t.Fatalf("dead letters %+v, want the refused message with its reason", dl)
	}
	if _, ok := dl[0].attrs["dedup_key"]; ok {
		t.Errorf("dead letter carries the output's id attribute: it should be the input as it came")
	}
	refuse.Store(false)
	r.publish("accepted", map[string]string{"key": "k1"})
	c := r.waitCounts("copy after the release", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	if c.DuplicateRepublish != 0 || c.InFlightConflict != 0 {
		t.Fatalf("counts %+v: the refused message's key was not released", c)
	}
}

// Inputs at Pub/Sub's limits still reach the dead-letter topic: a message
// with 100 attributes cannot take the key attribute on top, nor the reason,
// so it is wrapped; a reason longer than an attribute value is cut.
func TestDeadLetterAtPubSubLimits(t *testing.T) {
	addr := brokertest.Start(t)
	r := newRig(t, pubsubio.Insecure(addr), rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "ts"}}, deadLetter: true})
	r.start()
	full := map[string]string{"ts": "1700000000000"}
	for i := len(full); i < 100; i++ {
		full[fmt.Sprint("a", i)] = "v"
	}
	r.publish("full", full) // no key: falls back to the message ID, one attribute too many
	r.publish("long", map[string]string{"key": "k", "ts": strings.Repeat("é", 500)})
	r.waitCounts("both", func(c pipeline.Counts) bool { return c.DeadLettered == 2 })
	dl := r.drain(r.dlSub, 2, 300*time.Millisecond)
	if len(dl) != 2 {
		t.Fatalf("%d dead letters, want 2", len(dl))
	}
	env, long := dl[0], dl[1]
	if long.attrs[pipeline.AttrEnvelope] != "" {
		env, long = long, env
	}
	if env.attrs[pipeline.AttrEnvelope] != "json" {
		t.Fatalf("full message dead-lettered without an envelope: %v", env.attrs)
	}
	var orig struct {
		Data       []byte            `json:"data"`
		Attributes map[string]string `json:"attributes"`
	}
	if err := json.Unmarshal([]byte(env.data), &orig); err != nil || string(orig.Data) != "full" || len(orig.Attributes) != 100 {
		t.Fatalf("envelope %q does not hold the original (%v)", env.data, err)
	}
	reason := long.attrs[pipeline.AttrError]
	if len(reason) > 1024 || !utf8.ValidString(reason) || !strings.Contains(reason, "malformed") {
		t.Fatalf("reason of %d bytes, valid UTF-8 %v: want at most 1024 bytes naming the fault", len(reason), utf8.ValidString(reason))
	}
}

// A message near Pub/Sub's 10 MB that the output refuses (the output id
// attribute takes it over the limit) is dead-lettered, not nacked forever:
// without its data, which does not fit beside the reason, but with its
// attributes, the reason and the data's size.
func TestDeadLetterNearTenMegabytes(t *testing.T) {
	addr := brokertest.Start(t)
	r := newRig(t, pubsubio.Insecure(addr), rigOpts{deadLetter: true, cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}, OutputIDAttribute: "dedup_key"}})
	r.start()
	// With key=k1, 9,999,995 bytes, as the broker takes through REST (the
	// Go client's bundles stop short of it).
	body, _ := json.Marshal(map[string]any{"messages": []map[string]any{{
		"data": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 9_999_990)), "attributes": map[string]string{"key": "k1"}}}})
	resp, err := http.Post("http://"+addr+"/v1/"+r.in.String()+":publish", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var published struct {
		MessageIDs []string `json:"messageIds"`
	}
	err = json.NewDecoder(resp.Body).Decode(&published)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || len(published.MessageIDs) != 1 {
		t.Fatalf("publish of 9,999,995 bytes through REST: %d, %v", resp.StatusCode, err)
	}
	id := published.MessageIDs[0]
	c := r.waitCounts("the dead letter", func(c pipeline.Counts) bool { return c.DeadLettered == 1 })
	if c.Emitted != 0 {
		t.Fatalf("counts %+v: the output took a message over the limit", c)
	}
	dl := r.drain(r.dlSub, 1, 300*time.Millisecond)
	if len(dl) != 1 {
		t.Fatalf("%d dead letters, want 1", len(dl))
	}
	a := dl[0].attrs
	if dl[0].data != "" || a[pipeline.AttrDataDropped] != "9999990" || a["key"] != "k1" || a[pipeline.AttrSourceMessageID] != id ||
		!strings.Contains(a[pipeline.AttrError], "message too large") || !strings.Contains(a[pipeline.AttrError], "9999990 bytes of data do not fit") {
		t.Fatalf("dead letter: %d bytes of data, attributes %v; want no data, the original attributes, its size and the reason", len(dl[0].data), a)
	}
}

// A message the dead-letter topic refuses too (here: every publish to it)
// is held back longer at each delivery and logged as an error at the 1st,
// 10th, 100th..., not at every delivery; the topic is not taken for down.
func TestDeadLetterRefusedToo(t *testing.T) {
	var dlTopic atomic.Value
	dlTopic.Store("")
	srv, conn := newPstest(t, pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(func(req any) (bool, any, error) {
		if r := req.(*pubsubpb.PublishRequest); r.Topic == dlTopic.Load().(string) {
			return true, nil, status.Error(codes.InvalidArgument, "injected: dead letter refused")
		}
		return false, nil, nil
	})})
	var logs testenv.Buffer
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{TimestampAttribute: "occurred_at"}}, deadLetter: true, log: slog.New(slog.NewTextHandler(&logs, nil))})
	dlTopic.Store(r.dl.String())
	r.start()
	id := r.publish("bad", map[string]string{"occurred_at": "soon"})
	r.waitCounts("nacks", func(c pipeline.Counts) bool { return c.Retried >= 3 })
	r.stop()
	if n := strings.Count(logs.String(), "level=ERROR msg=\"unusable message nacked: the dead-letter topic refuses it too"); n != 1 {
		t.Errorf("%d error lines for one message the dead-letter topic refuses, want 1:\n%s", n, &logs)
	}
	if strings.Contains(logs.String(), "moving an unusable message aside failed") {
		t.Errorf("logged at every delivery as a failing dead-letter topic:\n%s", &logs)
	}
	if m := srv.Message(id); m.Acks != 0 {
		t.Fatalf("the message was acked %d times", m.Acks)
	}
}
