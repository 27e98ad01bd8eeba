package columns

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dedupflow/dedupflow/sink"
)

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		spec string
		want []Column
		err  string
	}{
		{spec: "all", want: []Column{{Key, "eid"}, {MessageID, "message_id"}, {PublishTime, "publish_time"},
			{Attributes, "attributes"}, {Data, "data"}, {Subscription, "subscription_name"}}},
		{spec: "none"},
		{spec: ""},
		{spec: "publish_time, key", want: []Column{{Key, "eid"}, {PublishTime, "publish_time"}}},
		{spec: "key=id,data=payload", want: []Column{{Key, "id"}, {Data, "payload"}}},
		{spec: "key,bogus", err: `unknown metadata column "bogus"`},
		{spec: "data,data", err: "data is listed twice"},
		{spec: "data=", err: "data= names no column"},
		{spec: "key=data,data", err: `key and data are both named "data"`},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			md, err := Parse(tc.spec, "eid")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Parse(%q) = %v, want an error with %q", tc.spec, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, md.Columns()); diff != "" {
				t.Errorf("Parse(%q) columns (-want +got):\n%s", tc.spec, diff)
			}
		})
	}
}

func TestValues(t *testing.T) {
	pt := time.Date(2026, 3, 1, 12, 0, 0, 123456789, time.UTC)
	const sub = "projects/p/subscriptions/s"
	for _, tc := range []struct {
		name string
		m    sink.Message
		want []any
	}{
		{"keyed", sink.Message{ID: "m1", Key: "k1", Data: []byte("x"), PublishTime: pt, Attributes: map[string]string{"a": "1"}},
			[]any{"k1", "m1", pt, json.RawMessage(`{"a":"1"}`), []byte("x"), sub}},
		// A message passed without dedup is keyed on its message ID, and
		// no attributes are an empty object, not null.
		{"unkeyed", sink.Message{ID: "m2", PublishTime: pt},
			[]any{"m2", "m2", pt, json.RawMessage(`{}`), []byte(nil), sub}},
		{"retaken", sink.Message{ID: "m3", Key: "k3", PublishTime: pt, Retaken: true},
			[]any{"k3", "m3", pt, json.RawMessage(`{}`), []byte(nil), sub}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vs, err := All("eid").Values(&tc.m, sub)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]any, len(vs))
			for i, v := range vs {
				got[i] = v.V
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("values (-want +got):\n%s", diff)
			}
		})
	}
}

func TestValuesFollowColumns(t *testing.T) {
	md, err := Parse("data=payload,key", "eid")
	if err != nil {
		t.Fatal(err)
	}
	vs, err := md.Values(&sink.Message{ID: "m", Key: "k", Data: []byte("d")}, "s")
	if err != nil {
		t.Fatal(err)
	}
	want := []Value{{Column{Key, "eid"}, "k"}, {Column{Data, "payload"}, []byte("d")}}
	if diff := cmp.Diff(want, vs); diff != "" {
		t.Errorf("values (-want +got):\n%s", diff)
	}
	if !md.Has("payload") || md.Has("data") {
		t.Errorf("Has: payload %v, data %v; want true, false", md.Has("payload"), md.Has("data"))
	}
}

func TestFields(t *testing.T) {
	names := []string{"id", "n", "gone", "nested"}
	for _, tc := range []struct {
		name string
		data string
		want []json.RawMessage
		err  string
	}{
		{name: "object", data: `{"id":"a","n":3,"nested":{"x":[1]},"other":true}`,
			want: []json.RawMessage{json.RawMessage(`"a"`), json.RawMessage(`3`), nil, json.RawMessage(`{"x":[1]}`)}},
		{name: "null field", data: ` {"id":null}`,
			want: []json.RawMessage{json.RawMessage(`null`), nil, nil, nil}},
		{name: "array", data: `[1,2]`, err: `payload is not a JSON object, so it has no field "id"`},
		{name: "not JSON", data: `payload-1`, err: `payload is not a JSON object, so it has no field "id"`},
		{name: "empty", data: ``, err: `payload is not a JSON object`},
		{name: "broken object", data: `{"id":`, err: `payload is not a JSON object`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Fields([]byte(tc.data), names)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, sink.ErrPermanent) {
					t.Fatalf("Fields(%q) = %v, want a permanent error with %q", tc.data, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("fields (-want +got):\n%s", diff)
			}
		})
	}
}

// Without fields asked for, the payload is not read: a binary payload
// goes to a metadata-only table as it is.
func TestFieldsNoneAsked(t *testing.T) {
	got, err := Fields([]byte{0xff, 0}, nil)
	if err != nil || got != nil {
		t.Errorf("Fields(binary, nil) = %v, %v; want nil, nil", got, err)
	}
}

// TestFieldsLiteralNames: a name is a field's name, not a path, and the
// last of a name given twice wins, as encoding/json decodes it.
func TestFieldsLiteralNames(t *testing.T) {
	got, err := Fields([]byte(`{"a.b":1,"a":{"b":2},"x":"first","x":"last","q\"uote":3,"*":4}`), []string{"a.b", "x", `q"uote`, "*", "a"})
	if err != nil {
		t.Fatal(err)
	}
	want := []json.RawMessage{json.RawMessage(`1`), json.RawMessage(`"last"`), json.RawMessage(`3`), json.RawMessage(`4`), json.RawMessage(`{"b":2}`)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fields (-want +got):\n%s", diff)
	}
}

func BenchmarkFields(b *testing.B) {
	data := []byte(`{"order":12345,"customer":"c-42","items":[{"sku":"A-1","qty":2}],"total":19.99}`)
	names := []string{"customer", "total"}
	for b.Loop() {
		if _, err := Fields(data, names); err != nil {
			b.Fatal(err)
		}
	}
}
