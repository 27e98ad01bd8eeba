package bigtable

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

func TestRowKey(t *testing.T) {
	m := &sink.Message{ID: "m1", Key: "k1", Attributes: map[string]string{"region": "eu"}, Data: []byte(`{"customer":"ann","n":7,"none":null}`)}
	for _, tc := range []struct {
		tmpl, want string
	}{
		{"", "k1"},
		{"{key}", "k1"},
		{"orders#{message_id}", "orders#m1"},
		{"{attributes.region}#{data.customer}#{data.n}#{key}", "eu#ann#7#k1"},
		{"{attributes.zone}", "error: row key: no attribute zone"},
		{"{data.none}", "error: row key: no field none in the payload"},
		{"{data}", `parse: unknown {data}`},
		{"{user}", `parse: unknown {user}: want {key}, {message_id}, {attributes.NAME} or {data.NAME}`},
		{"a{key", "parse: a { is not closed"},
	} {
		t.Run(tc.tmpl, func(t *testing.T) {
			rk, err := ParseRowKey(tc.tmpl)
			if msg, ok := strings.CutPrefix(tc.want, "parse: "); ok {
				if err == nil || !strings.Contains(err.Error(), msg) {
					t.Fatalf("ParseRowKey: %v, want an error saying %q", err, msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var fields []json.RawMessage
			if len(rk.fields) > 0 {
				if fields, err = columns.Fields(m.Data, rk.fields); err != nil {
					t.Fatal(err)
				}
			}
			got, err := rk.key(m, fields)
			if msg, ok := strings.CutPrefix(tc.want, "error: "); ok {
				if err == nil || !errors.Is(err, sink.ErrPermanent) || !strings.Contains(err.Error(), msg) {
					t.Fatalf("key: %v, want a permanent error saying %q", err, msg)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("key = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
