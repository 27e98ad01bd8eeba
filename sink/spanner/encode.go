package spanner

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/civil"
	"cloud.google.com/go/spanner"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// row is one message's values, in the order of the sink's columns, and
// roughly its size, for the commit's byte budget.
type row struct {
	vals []any
	size int
}

// encode turns m into a row. Everything the table could refuse is settled
// here, naming the column, so that one bad message does not fail the
// commit that carries the good ones.
func (s *Sink) encode(m *sink.Message) (row, error) {
	meta, err := s.opt.Metadata.Values(m, s.opt.Subscription)
	if err != nil {
		return row{}, err
	}
	fields, err := columns.Fields(m.Data, s.fieldNames)
	if err != nil {
		return row{}, err
	}
	r := row{vals: make([]any, len(s.cols))}
	mi, fi := 0, 0
	for i, c := range s.cols {
		var v any
		var n int
		if c.meta {
			v, n, err = metaValue(c, meta[mi].V)
			mi++
		} else {
			v, n, err = fieldValue(c, fields[fi])
			fi++
		}
		if err != nil {
			return row{}, fmt.Errorf("%w: column %s: %w", errInvalid, c.name, err)
		}
		r.vals[i] = v
		r.size += n + len(c.name)
	}
	return r, nil
}

// metaValue is a metadata value as c's type holds it, and its size.
func metaValue(c column, v any) (any, int, error) {
	switch v := v.(type) {
	case string:
		return str(c, v)
	case time.Time:
		return v, 12, nil
	case json.RawMessage:
		if c.typ.base == "JSON" {
			return spanner.NullJSON{Value: v, Valid: true}, len(v), nil
		}
		return str(c, string(v))
	case []byte:
		if c.typ.base == "STRING" {
			return str(c, string(v))
		}
		if c.typ.max > 0 && len(v) > c.typ.max {
			return nil, 0, fmt.Errorf("%d bytes, over the column's %d", len(v), c.typ.max)
		}
		if v == nil {
			v = []byte{} // an empty payload is legal in Pub/Sub; NULL would say there was none
		}
		return v, len(v), nil
	}
	panic(fmt.Sprintf("spanner sink: metadata value of type %T", v))
}

// str checks s against a STRING column: valid UTF-8, within its length.
func str(c column, s string) (any, int, error) {
	if !utf8.ValidString(s) {
		return nil, 0, fmt.Errorf("not valid UTF-8, which a STRING column needs")
	}
	if n := utf8.RuneCountInString(s); c.typ.max > 0 && n > c.typ.max {
		return nil, 0, fmt.Errorf("%d characters, over the column's %d", n, c.typ.max)
	}
	return s, len(s), nil
}

// nulls are each type's NULL.
var nulls = map[string]any{
	"STRING": spanner.NullString{}, "BYTES": []byte(nil), "INT64": spanner.NullInt64{},
	"FLOAT64": spanner.NullFloat64{}, "FLOAT32": spanner.NullFloat32{}, "BOOL": spanner.NullBool{},
	"TIMESTAMP": spanner.NullTime{}, "DATE": spanner.NullDate{}, "NUMERIC": spanner.NullNumeric{}, "JSON": spanner.NullJSON{},
}

// fieldValue converts a field's JSON text to c's type, as BigQuery reads
// JSON rows: strings for STRING, BYTES (base64), TIMESTAMP (RFC 3339) and
// DATE; numbers (or strings holding them, for integers beyond a double's
// precision) for INT64, FLOAT and NUMERIC; any JSON for a JSON column.
func fieldValue(c column, raw json.RawMessage) (any, int, error) {
	if raw == nil || string(raw) == "null" {
		if !c.nullable {
			return nil, 0, errors.New("field missing or null, and the column is NOT NULL")
		}
		return nulls[c.typ.base], 0, nil
	}
	switch c.typ.base {
	case "JSON":
		return spanner.NullJSON{Value: raw, Valid: true}, len(raw), nil
	case "BOOL":
		var b bool
		if err := json.Unmarshal(raw, &b); err != nil {
			return nil, 0, fmt.Errorf("want true or false, got %.40s", raw)
		}
		return b, 1, nil
	case "INT64", "FLOAT64", "FLOAT32", "NUMERIC":
		return number(c, raw)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return nil, 0, fmt.Errorf("want a JSON string for %s, got %.40s", c.typ.base, raw)
	}
	switch c.typ.base {
	case "STRING":
		return str(c, s)
	case "BYTES":
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, 0, fmt.Errorf("want base64 for BYTES: %w", err)
		}
		if c.typ.max > 0 && len(b) > c.typ.max {
			return nil, 0, fmt.Errorf("%d bytes, over the column's %d", len(b), c.typ.max)
		}
		return b, len(b), nil
	case "TIMESTAMP":
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, 0, fmt.Errorf("want an RFC 3339 time: %w", err)
		}
		return t, 12, nil
	}
	d, err := civil.ParseDate(s)
	if err != nil {
		return nil, 0, fmt.Errorf("want a date as YYYY-MM-DD: %w", err)
	}
	return d, 4, nil
}

// number converts a JSON number, or a string holding one, to c's numeric
// type.
func number(c column, raw json.RawMessage) (any, int, error) {
	t := string(raw)
	if raw[0] == '"' {
		if err := json.Unmarshal(raw, &t); err != nil {
			return nil, 0, err
		}
	} else if raw[0] != '-' && (raw[0] < '0' || raw[0] > '9') {
		return nil, 0, fmt.Errorf("want a number for %s, got %.40s", c.typ.base, raw)
	}
	switch c.typ.base {
	case "INT64":
		n, err := strconv.ParseInt(t, 10, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("want an INT64: %w", err)
		}
		return n, 8, nil
	case "FLOAT64":
		f, err := strconv.ParseFloat(t, 64)
		if err != nil {
			return nil, 0, fmt.Errorf("want a FLOAT64: %w", err)
		}
		return f, 8, nil
	case "FLOAT32":
		f, err := strconv.ParseFloat(t, 32)
		if err != nil {
			return nil, 0, fmt.Errorf("want a FLOAT32: %w", err)
		}
		return float32(f), 4, nil
	}
	r, ok := new(big.Rat).SetString(t)
	if !ok {
		return nil, 0, fmt.Errorf("want a NUMERIC, got %.40s", t)
	}
	return spanner.NullNumeric{Numeric: *r, Valid: true}, 16, nil
}
