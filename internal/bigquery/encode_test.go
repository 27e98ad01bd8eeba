package bigquery

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigquery"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
)

// events is a table as users make them for JSON events, with the
// metadata columns of a BigQuery subscription.
var events = bigquery.Schema{
	{Name: "id", Type: bigquery.StringFieldType, Required: true},
	{Name: "n", Type: bigquery.IntegerFieldType},
	{Name: "price", Type: bigquery.FloatFieldType},
	{Name: "ok", Type: bigquery.BooleanFieldType},
	{Name: "at", Type: bigquery.TimestampFieldType},
	{Name: "day", Type: bigquery.DateFieldType},
	{Name: "blob", Type: bigquery.BytesFieldType},
	{Name: "doc", Type: bigquery.JSONFieldType},
	{Name: "tags", Type: bigquery.StringFieldType, Repeated: true},
	{Name: "place", Type: bigquery.RecordFieldType, Schema: bigquery.Schema{
		{Name: "city", Type: bigquery.StringFieldType, Required: true},
		{Name: "zip", Type: bigquery.IntegerFieldType},
	}},
	{Name: "subscription_name", Type: bigquery.StringFieldType},
	{Name: "message_id", Type: bigquery.StringFieldType},
	{Name: "publish_time", Type: bigquery.TimestampFieldType},
	{Name: "attributes", Type: bigquery.JSONFieldType},
	{Name: "data", Type: bigquery.BytesFieldType},
}

func eventsTable(t *testing.T) *Table {
	t.Helper()
	tb, err := newTable("p", TableRef{"d", "events"}, events)
	if err != nil {
		t.Fatal(err)
	}
	return tb
}

// decode reads an encoded row back as JSON, by column name.
func decode(t *testing.T, tb *Table, b []byte) map[string]any {
	t.Helper()
	m := dynamicpb.NewMessage(tb.msg)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatal(err)
	}
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(js, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEncodeTableSchema(t *testing.T) {
	tb := eventsTable(t)
	pt := time.Date(2026, 3, 1, 12, 0, 0, 123456000, time.UTC)
	data := `{"id":"e1","n":"42","price":9.5,"ok":true,"at":"2026-03-01T12:00:00.5Z","day":"1970-01-11",
		"blob":"aGk=","doc":{"x":[1,2]},"tags":["a","b"],"place":{"city":"Oslo","zip":150},"extra":1}`
	b, err := tb.Encode(Row{Data: []byte(data), Meta: Metadata("projects/p/subscriptions/s", "m1", pt, map[string]string{"k": "v"})},
		Options{UseTableSchema: true, DropUnknownFields: true})
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, tb, b)
	want := map[string]any{
		"id": "e1", "n": "42", "price": 9.5, "ok": true, "at": "1772366400500000", "day": float64(10),
		"blob": "aGk=", "doc": `{"x":[1,2]}`, "tags": []any{"a", "b"},
		"place":             map[string]any{"city": "Oslo", "zip": "150"},
		"subscription_name": "projects/p/subscriptions/s", "message_id": "m1",
		"publish_time": "1772366400123456", "attributes": `{"k":"v"}`,
	}
	for k, w := range want {
		if g, _ := json.Marshal(got[k]); string(g) != mustJSON(t, w) {
			t.Errorf("column %s = %s, want %s", k, g, mustJSON(t, w))
		}
	}
	if _, ok := got["data"]; ok {
		t.Errorf("data written with use_table_schema: %v", got["data"])
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Without use_table_schema the payload is not read, so a binary one goes
// to the data column whole.
func TestEncodeDataColumn(t *testing.T) {
	tb, err := newTable("p", TableRef{"d", "raw"}, bigquery.Schema{{Name: "data", Type: bigquery.BytesFieldType}, {Name: "k", Type: bigquery.StringFieldType}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := tb.Encode(Row{Data: []byte{0xff, 0}, Meta: []Value{{"data", []byte{0xff, 0}}, {"k", "key-1"}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	got := decode(t, tb, b)
	if got["data"] != "/wA=" || got["k"] != "key-1" {
		t.Errorf("row = %v, want data /wA= and k key-1", got)
	}
}

// Each way a message fails to fit names the column, and matches ErrUnfit
// so the caller can dead-letter it.
func TestEncodeUnfit(t *testing.T) {
	tb := eventsTable(t)
	on := Options{UseTableSchema: true}
	for _, tc := range []struct {
		data string
		o    Options
		want string
	}{
		{`{"id":"a","extra":1}`, on, "column extra: the table has no such column (drop_unknown_fields is off)"},
		{`{"n":1}`, Options{UseTableSchema: true, DropUnknownFields: true}, "column id: REQUIRED"},
		{`{"id":"a","n":1}`, Options{UseTableSchema: true, Fields: []string{"n"}}, "column id: REQUIRED"},
		{`{"id":"a","n":1.5}`, on, `column n: INTEGER, and "1.5" is not a 64-bit integer`},
		{`{"id":"a","n":"x"}`, on, `column n: INTEGER, and "x" is not a 64-bit integer`},
		{`{"id":7}`, on, "column id: STRING, and the message has a number"},
		{`{"id":"a","ok":[true]}`, on, "column ok: BOOLEAN, and the message has an array"},
		{`{"id":"a","at":"yesterday"}`, on, `column at: TIMESTAMP, and "yesterday" is not a timestamp`},
		{`{"id":"a","day":"01/02/2026"}`, on, `column day: DATE, and "01/02/2026" is not YYYY-MM-DD`},
		{`{"id":"a","blob":"%%"}`, on, "column blob: BYTES, and the message's string is not base64"},
		{`{"id":"a","tags":"x"}`, on, "column tags: ARRAY, and the message has a string"},
		{`{"id":"a","tags":["x",null]}`, on, "column tags[1]: an ARRAY holds no NULL"},
		{`{"id":"a","place":{"zip":1}}`, on, "column place: its field city is REQUIRED"},
		{`{"id":"a","place":{"city":"x","street":"y"}}`, on, "column place.street: the table has no such column"},
		{`[1]`, on, "the payload is not a JSON object"},
		{`not json`, on, "the payload is not a JSON object"},
	} {
		_, err := tb.Encode(Row{Data: []byte(tc.data)}, tc.o)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUnfit) {
			t.Errorf("Encode(%s) = %v, want an ErrUnfit with %q", tc.data, err, tc.want)
		}
	}
}

func TestEncodeMetadataUnfit(t *testing.T) {
	tb := eventsTable(t)
	for _, tc := range []struct {
		v    Value
		want string
	}{
		{Value{"nope", "x"}, "column nope: the table has no such column"},
		{Value{"n", "x"}, "column n: INTEGER, which cannot hold a string"},
		{Value{"doc", []byte("{broken")}, "column doc: JSON, and the payload is not JSON"},
	} {
		_, err := tb.Encode(Row{Meta: []Value{{"id", "a"}, tc.v}}, Options{})
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrUnfit) {
			t.Errorf("Encode(%v) = %v, want an ErrUnfit with %q", tc.v, err, tc.want)
		}
	}
	s, err := newTable("p", TableRef{"d", "s"}, bigquery.Schema{{Name: "data", Type: bigquery.StringFieldType}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Encode(Row{Meta: []Value{{"data", []byte{0xff}}}}, Options{}); err == nil || !strings.Contains(err.Error(), "column data: STRING, and the payload is not UTF-8") {
		t.Errorf("binary payload to a STRING column: %v", err)
	}
}

// Fits is the start-up check: it catches a table that no message could
// fit before the first message comes.
func TestFits(t *testing.T) {
	tb := eventsTable(t)
	meta := Metadata("s", "m", time.Now(), nil)
	if err := tb.Fits(meta, Options{UseTableSchema: true}); err != nil {
		t.Errorf("Fits(metadata, use_table_schema) = %v", err)
	}
	for _, tc := range []struct {
		meta []Value
		o    Options
		want string
	}{
		{meta, Options{}, "column id is REQUIRED, and only the payload's fields (use_table_schema) could fill it"},
		{[]Value{{"key", "x"}}, Options{UseTableSchema: true}, "table p.d.events has no column key"},
		{nil, Options{UseTableSchema: true, Fields: []string{"n", "colour"}}, "table p.d.events has no column colour for the payload's field"},
		{[]Value{{"price", time.Now()}}, Options{UseTableSchema: true}, "column price is FLOAT, which cannot hold a time"},
	} {
		if err := tb.Fits(tc.meta, tc.o); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Fits(%v) = %v, want %q", tc.meta, err, tc.want)
		}
	}
}
