package spanner

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/civil"
	"cloud.google.com/go/spanner"
)

// TestFieldValue: JSON fields become the column's type as BigQuery reads
// JSON rows, and anything else is an error saying what was wanted.
func TestFieldValue(t *testing.T) {
	for _, tc := range []struct {
		typ, raw string
		nullable bool
		want     any // or an error's text
	}{
		{"STRING(MAX)", `"héllo"`, true, "héllo"},
		{"STRING(3)", `"héllo"`, true, "5 characters, over the column's 3"},
		{"STRING(MAX)", `12`, true, "want a JSON string for STRING"},
		{"STRING(MAX)", ``, true, spanner.NullString{}},
		{"STRING(MAX)", `null`, false, "field missing or null, and the column is NOT NULL"},
		{"INT64", `42`, true, int64(42)},
		{"INT64", `"9007199254740993"`, true, int64(9007199254740993)},
		{"INT64", `4.5`, true, "want an INT64"},
		{"INT64", `true`, true, "want a number for INT64"},
		{"FLOAT64", `1.5e3`, true, 1500.0},
		{"FLOAT32", `0.5`, true, float32(0.5)},
		{"BOOL", `false`, true, false},
		{"BYTES(MAX)", `"aGk="`, true, []byte("hi")},
		{"BYTES(MAX)", `"%%"`, true, "want base64 for BYTES"},
		{"TIMESTAMP", `"2026-01-02T03:04:05.5Z"`, true, time.Date(2026, 1, 2, 3, 4, 5, 5e8, time.UTC)},
		{"TIMESTAMP", `"yesterday"`, true, "want an RFC 3339 time"},
		{"DATE", `"2026-02-03"`, true, civil.Date{Year: 2026, Month: 2, Day: 3}},
		{"JSON", `{"a":[1]}`, true, spanner.NullJSON{Value: json.RawMessage(`{"a":[1]}`), Valid: true}},
		{"NUMERIC", `"1.25"`, true, "1.250000000"},
	} {
		t.Run(tc.typ+" "+tc.raw, func(t *testing.T) {
			var raw json.RawMessage
			if tc.raw != "" {
				raw = json.RawMessage(tc.raw)
			}
			v, _, err := fieldValue(column{name: "c", typ: parseType(tc.typ), nullable: tc.nullable}, raw)
			if msg, ok := tc.want.(string); ok && (err != nil || tc.typ == "NUMERIC") {
				if err != nil && !strings.Contains(err.Error(), msg) {
					t.Fatalf("error %v, want one saying %q", err, msg)
				}
				if n, ok := v.(spanner.NullNumeric); ok && spanner.NumericString(&n.Numeric) != msg {
					t.Fatalf("numeric %s, want %s", spanner.NumericString(&n.Numeric), msg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprintf("%#v", v) != fmt.Sprintf("%#v", tc.want) {
				t.Errorf("got %#v, want %#v", v, tc.want)
			}
		})
	}
}
