package udf

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const upper = `function up(message, metadata) {
  message.data = message.data.toUpperCase();
  message.attributes["id"] = metadata.message_id;
  message.attributes["at"] = metadata.publish_time;
  message.attributes["key"] = metadata.ordering_key;
  return message;
}`

func TestApplyReplacesDataAndAttributes(t *testing.T) {
	f, err := Compile("up", upper)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 10, 11, 12, 500, time.UTC)
	out, keep, err := f.Apply(Message{Data: []byte("héllo"), Attributes: map[string]string{"a": "1"}},
		Metadata{MessageID: "42", PublishTime: at, OrderingKey: "k"})
	if err != nil || !keep {
		t.Fatalf("keep=%v err=%v", keep, err)
	}
	if string(out.Data) != "HÉLLO" {
		t.Errorf("data = %q", out.Data)
	}
	want := map[string]string{"a": "1", "id": "42", "at": "2026-12-02T10:11:12Z", "key": "k"}
	for k, v := range want {
		if out.Attributes[k] != v {
			t.Errorf("attribute %s = %q, want %q", k, out.Attributes[k], v)
		}
	}
}

func TestApplyNullFilters(t *testing.T) {
	f, err := Compile("drop", `function drop(m) { return m.attributes.keep === "yes" ? m : null; }`)
	if err != nil {
		t.Fatal(err)
	}
	if _, keep, err := f.Apply(Message{Data: []byte("x")}, Metadata{}); keep || err != nil {
		t.Fatalf("keep=%v err=%v, want filtered", keep, err)
	}
	if _, keep, err := f.Apply(Message{Data: []byte("x"), Attributes: map[string]string{"keep": "yes"}}, Metadata{}); !keep || err != nil {
		t.Fatalf("keep=%v err=%v, want kept", keep, err)
	}
}

func TestApplyEmptyAttributesRemoveAll(t *testing.T) {
	f, err := Compile("f", `function f(m) { return {data: m.data, attributes: {}}; }`)
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := f.Apply(Message{Data: []byte("x"), Attributes: map[string]string{"a": "1"}}, Metadata{})
	if err != nil || len(out.Attributes) != 0 {
		t.Fatalf("attributes = %v, err %v", out.Attributes, err)
	}
}

func TestApplyFailures(t *testing.T) {
	for name, code := range map[string]string{
		"threw: Error: boom":              `function f(m) { throw new Error("boom"); }`,
		"no data":                         `function f(m) { return {attributes: {}}; }`,
		"not a string":                    `function f(m) { return {data: 5}; }`,
		"attribute \"n\" is not a string": `function f(m) { return {data: "x", attributes: {n: 1}}; }`,
		"not an object or null":           `function f(m) { return "x"; }`,
		"threw: Error: in a getter":       `function f(m) { return {get data() { throw new Error("in a getter"); }}; }`,
	} {
		f, err := Compile("f", code)
		if err != nil {
			t.Fatal(err)
		}
		_, keep, err := f.Apply(Message{Data: []byte("x")}, Metadata{})
		if err == nil || keep || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: keep=%v err=%v", code, keep, err)
		}
	}
}

func TestApplyStopsALongRun(t *testing.T) {
	f, err := Compile("spin", `function spin(m) { while (true) {} }`)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.Apply(Message{Data: []byte("x")}, Metadata{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want ErrTimeout", err)
	}
	// A getter on the returned object is the function's code too.
	g, err := Compile("g", `function g(m) { return {get data() { while (true) {} }}; }`)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := g.Apply(Message{Data: []byte("x")}, Metadata{}); !errors.Is(err, ErrTimeout) {
		t.Fatalf("getter: err = %v, want ErrTimeout", err)
	}
	// A fresh runtime serves the next call.
	ok, _ := Compile("ok", `function ok(m) { return m; }`)
	if _, keep, err := ok.Apply(Message{Data: []byte("x")}, Metadata{}); !keep || err != nil {
		t.Fatalf("keep=%v err=%v", keep, err)
	}
}

func TestCompileRefusesBadCode(t *testing.T) {
	for _, c := range []struct{ name, code, want string }{
		{"f", `function f(m) { return m;`, "does not parse"},
		{"g", `function f(m) { return m; }`, `no function named "g"`},
		{"f", `var f = 3;`, `no function named "f"`},
		{"", `function f(m) {}`, "function_name is empty"},
		{"f", "", "code is empty"},
		{"f", strings.Repeat(" ", MaxCodeBytes+1), "more than"},
		{"f", `throw new Error("top")`, "fails when loaded"},
		{"f", `while (true) {}`, "fails when loaded"},
	} {
		if _, err := Compile(c.name, c.code); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile(%q, %.30q) = %v, want %q", c.name, c.code, err, c.want)
		}
	}
}

func TestApplyConcurrent(t *testing.T) {
	f, err := Compile("up", upper)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error)
	for i := 0; i < 8; i++ {
		go func() {
			var err error
			for j := 0; j < 50 && err == nil; j++ {
				var out Message
				out, _, err = f.Apply(Message{Data: []byte("a")}, Metadata{MessageID: "1", PublishTime: time.Now(), OrderingKey: "k"})
				if err == nil && string(out.Data) != "A" {
					err = errors.New("wrong data " + string(out.Data))
				}
			}
			done <- err
		}()
	}
	for i := 0; i < 8; i++ {
		if err := <-done; err != nil {
			t.Error(err)
		}
	}
}

// keeper keeps state three ways: a global array, a closure and a built-in
// prototype. Each returns how many messages it has seen.
const keeper = `var seen = [];
var count = (function () { var n = 0; return function () { return ++n; }; })();
Array.prototype.total = (Array.prototype.total || 0) + 1;
function keep(m) {
  seen.push(m.data);
  return {data: m.data, attributes: {
    global: String(seen.length), closure: String(count()), prototype: String([].total)}};
}`

func TestApplyIsolatesMessages(t *testing.T) {
	f, err := Compile("keep", keeper)
	if err != nil {
		t.Fatal(err)
	}
	const callers, calls = 4, 200
	errs := make(chan error, callers)
	for range callers {
		go func() {
			for i := range calls {
				out, _, err := f.Apply(Message{Data: []byte("m")}, Metadata{})
				if err != nil {
					errs <- err
					return
				}
				for k, v := range out.Attributes {
					if v != "1" {
						errs <- fmt.Errorf("call %d: %s state = %s after earlier messages, want 1", i, k, v)
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range callers {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

func BenchmarkApply(b *testing.B) {
	f, err := Compile("up", upper)
	if err != nil {
		b.Fatal(err)
	}
	m := Message{Data: []byte(`{"id":1,"name":"a small event"}`), Attributes: map[string]string{"k": "v"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := f.Apply(m, Metadata{MessageID: "1", PublishTime: time.Now(), OrderingKey: "k"}); err != nil {
			b.Fatal(err)
		}
	}
}
