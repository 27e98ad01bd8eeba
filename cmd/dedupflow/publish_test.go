package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/google/uuid"

	"github.com/dedupflow/dedupflow/publisher"
)

// pubServer starts a pstest server with topic "projects/test-project/topics/
// <topic>" and points the official client at it the way users point it at
// an emulator.
func pubServer(t *testing.T, topics ...string) *pstest.Server {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	t.Setenv("PUBSUB_EMULATOR_HOST", srv.Addr)
	for _, tp := range topics {
		if _, err := srv.GServer.CreateTopic(context.Background(), &pb.Topic{Name: "projects/test-project/topics/" + tp}); err != nil {
			t.Fatal(err)
		}
	}
	return srv
}

func pubRun(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var o, e bytes.Buffer
	err = run(context.Background(), args, &o, &e)
	return o.String(), e.String(), err
}

var pubLine = regexp.MustCompile(`^message_id=(\S+) (\S+)=(\S+)( copy=\d+/\d+)?$`)

func TestPublishCopiesShareOneKey(t *testing.T) {
	srv := pubServer(t, "orders")
	out, _, err := pubRun(t, "publish", "--project", "test-project", "--topic", "orders",
		"--data", "hello", "--attr", "source=web", "--attr", "note=a=b", "--key", "order-123", "--copies", "3")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	msgs := srv.Messages()
	if len(lines) != 3 || len(msgs) != 3 {
		t.Fatalf("%d lines, %d stored; want 3 and 3:\n%s", len(lines), len(msgs), out)
	}
	seen := map[string]bool{}
	for i, m := range msgs {
		want := "message_id=" + m.ID + " key=order-123 copy=" + string(rune('1'+i)) + "/3"
		if lines[i] != want {
			t.Errorf("line %d %q, want %q", i, lines[i], want)
		}
		if seen[m.ID] {
			t.Errorf("message ID %s twice: each copy is a new message", m.ID)
		}
		seen[m.ID] = true
		a := m.Attributes
		if string(m.Data) != "hello" || a["key"] != "order-123" || a["source"] != "web" || a["note"] != "a=b" || len(a) != 3 {
			t.Errorf("copy %d: %q %v", i, m.Data, a)
		}
	}
}

func TestPublishGeneratedKeyFromFile(t *testing.T) {
	srv := pubServer(t, "events")
	f := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(f, []byte(`{"n":1}`), 0o600); err != nil {
		t.Fatal(err)
	}
	out, _, err := pubRun(t, "publish", "--topic", "projects/test-project/topics/events", "--file", f,
		"--copies", "2", "--id-attribute", "id", "--timestamp-attribute", "ts")
	if err != nil {
		t.Fatal(err)
	}
	msgs := srv.Messages()
	if len(msgs) != 2 {
		t.Fatalf("%d stored:\n%s", len(msgs), out)
	}
	key := msgs[0].Attributes["id"]
	if u, err := uuid.Parse(key); err != nil || u.Version() != 7 {
		t.Fatalf("key %q is not a UUIDv7", key)
	}
	if msgs[1].Attributes["id"] != key || msgs[0].Attributes["ts"] == "" || msgs[1].Attributes["ts"] != msgs[0].Attributes["ts"] {
		t.Errorf("copies %v and %v: want one key and one event time", msgs[0].Attributes, msgs[1].Attributes)
	}
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if m := pubLine.FindStringSubmatch(l); m == nil || m[2] != "id" || m[3] != key {
			t.Errorf("line %q", l)
		}
	}
	if string(msgs[0].Data) != `{"n":1}` {
		t.Errorf("data %q", msgs[0].Data)
	}
}

func TestPublishBadInput(t *testing.T) {
	srv := pubServer(t, "orders")
	base := []string{"publish", "--project", "test-project", "--topic", "orders"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"attr without =", []string{"--data", "x", "--attr", "source"}, `"source" has no '='`},
		{"attr without name", []string{"--data", "x", "--attr", "=v"}, "empty attribute name"},
		{"attr twice", []string{"--data", "x", "--attr", "a=1", "--attr", "a=2"}, `attribute "a" given twice`},
		{"data and file", []string{"--data", "x", "--file", "f"}, "not both"},
		{"no data", nil, "missing message data"},
		{"copies 0", []string{"--data", "x", "--copies", "0"}, "--copies 0 must be at least 1"},
		{"empty id attribute", []string{"--data", "x", "--id-attribute", ""}, "--id-attribute must not be empty"},
		{"missing file", []string{"--file", filepath.Join(t.TempDir(), "nope")}, "read --file"},
		{"key too long", []string{"--data", "x", "--key", strings.Repeat("k", 1025)}, "key too long"},
		{"empty message", []string{"--data", ""}, "empty message"},
		{"non-UTF-8 attribute", []string{"--data", "x", "--attr", "a=\xff"}, "not valid UTF-8"},
		{"two keys", []string{"--data", "x", "--key", "a", "--attr", "key=b"}, `conflicting key: --key "a" but --attr key="b"`},
		{"positional", []string{"--data", "x", "extra"}, `unexpected argument "extra"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := pubRun(t, append(base, tc.args...)...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	if _, _, err := pubRun(t, "publish", "--data", "x"); err == nil || !strings.Contains(err.Error(), "missing --topic") {
		t.Errorf("no topic: %v", err)
	}
	if n := len(srv.Messages()); n != 0 {
		t.Errorf("bad input published %d messages", n)
	}
}

func TestLogfmt(t *testing.T) {
	for in, want := range map[string]string{
		"order-123": "order-123", "": `""`, "a b": `"a b"`, "x\x1b[2J": `"x\x1b[2J"`, `q"`: `"q\""`,
	} {
		if got := logfmt(in); got != want {
			t.Errorf("logfmt(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestFormerIDFlag: --key-attribute, the former name of --id-attribute,
// still sets it in publish and loadgen, from the command line or the
// environment, with a warning naming the new one; the two names set to
// different values are refused rather than one silently winning.
func TestFormerIDFlag(t *testing.T) {
	const warning = "--key-attribute is now --id-attribute"
	cmds := map[string][]string{
		"publish": {"publish", "--project", "test-project", "--topic", "orders", "--data", "x", "--key", "k1"},
		"loadgen": {"loadgen", "--project", "test-project", "--topic", "orders", "--count", "2", "--progress", "off"},
	}
	for name, base := range cmds {
		for _, tc := range []struct {
			name      string
			args, env []string // env: name, value
			attr      string   // empty: refused
		}{
			{"flag", []string{"--key-attribute", "event_id"}, nil, "event_id"},
			{"both names, one value", []string{"--key-attribute", "event_id", "--id-attribute", "event_id"}, nil, "event_id"},
			{"environment", nil, []string{"DEDUPFLOW_KEY_ATTRIBUTE", "event_id"}, "event_id"},
			{"both names, two values", []string{"--id-attribute", "a", "--key-attribute", "b"}, nil, ""},
			{"flag and former environment", []string{"--id-attribute", "a"}, []string{"DEDUPFLOW_KEY_ATTRIBUTE", "b"}, ""},
		} {
			t.Run(name+"/"+tc.name, func(t *testing.T) {
				srv := pubServer(t, "orders")
				if tc.env != nil {
					t.Setenv(tc.env[0], tc.env[1])
				}
				_, errOut, err := pubRun(t, append(append([]string{}, base...), tc.args...)...)
				if !strings.Contains(errOut, warning) {
					t.Errorf("stderr %q: want the deprecation warning", errOut)
				}
				if tc.attr == "" {
					if err == nil || !strings.Contains(err.Error(), "give --id-attribute only") {
						t.Fatalf("error %v: want the two names refused", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				msgs := srv.Messages()
				if len(msgs) == 0 {
					t.Fatal("nothing published")
				}
				for _, m := range msgs {
					if m.Attributes[tc.attr] == "" || m.Attributes[publisher.DefaultIDAttribute] != "" {
						t.Errorf("attributes %v: want the key in %s only", m.Attributes, tc.attr)
					}
				}
			})
		}
	}
}
