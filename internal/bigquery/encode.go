package bigquery

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/bigquery"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Options say how a message becomes a row, as a BigQuery subscription's
// bigquery_config says it (write_metadata is the caller's choice of
// Row.Meta, see Metadata).
type Options struct {
	// UseTableSchema: the payload is a JSON object whose fields go to the
	// columns of the same names. Without it the payload is not read.
	UseTableSchema bool
	// DropUnknownFields: with UseTableSchema, a field with no column is
	// dropped; without it the message does not fit.
	DropUnknownFields bool
	// Fields, when set, are the only payload fields read: the others are
	// dropped, as Google's Dataflow templates take the fields they name.
	Fields []string
}

// Value is one column's value from outside the payload: a string, a
// time.Time, a []byte or a json.RawMessage.
type Value struct {
	Column string
	V      any
}

// Row is what a message gives a table: its payload and the values of
// its metadata columns (the payload itself goes to a column as a Value).
type Row struct {
	Data []byte
	Meta []Value
}

// ErrUnfit is what every error of a message that does not fit the table
// matches: no retry makes it fit.
var ErrUnfit = errors.New("message does not fit the table")

// FieldError is a message that does not fit one column.
type FieldError struct {
	Column string // dotted for a field of a RECORD
	Reason string
}

func (e *FieldError) Error() string     { return "column " + e.Column + ": " + e.Reason }
func (e *FieldError) Is(err error) bool { return err == ErrUnfit }

// Metadata are the columns a BigQuery subscription with write_metadata
// writes: subscription_name, message_id, publish_time and attributes (a
// JSON object, as Pub/Sub writes it to a STRING or JSON column).
func Metadata(subscription, messageID string, publish time.Time, attrs map[string]string) []Value {
	if attrs == nil {
		attrs = map[string]string{}
	}
	a, _ := json.Marshal(attrs) // a map of strings always marshals
	return []Value{
		{"subscription_name", subscription}, {"message_id", messageID},
		{"publish_time", publish}, {"attributes", json.RawMessage(a)},
	}
}

// Encode makes r a row of t, serialized as the Storage Write API takes it.
// An error matches ErrUnfit and names the column (a *FieldError), except
// when the payload is no JSON object at all.
func (t *Table) Encode(r Row, o Options) ([]byte, error) {
	m := dynamicpb.NewMessage(t.msg)
	set := make([]bool, len(t.Schema))
	if o.UseTableSchema {
		d := json.NewDecoder(bytes.NewReader(r.Data))
		d.UseNumber()
		var obj map[string]any
		if err := d.Decode(&obj); err != nil || obj == nil {
			return nil, fmt.Errorf("%w: the payload is not a JSON object (use_table_schema)", ErrUnfit)
		}
		if len(o.Fields) > 0 {
			obj = pick(obj, o.Fields)
		}
		if err := fill(m, t.Schema, obj, o, "", set); err != nil {
			return nil, err
		}
	}
	for _, v := range r.Meta {
		i := column(t.Schema, v.Column)
		if i < 0 {
			return nil, &FieldError{v.Column, "the table has no such column"}
		}
		if err := setMeta(m, t.msg.Fields().ByNumber(protoreflect.FieldNumber(i+1)), t.Schema[i], v.V); err != nil {
			return nil, err
		}
		set[i] = true
	}
	for i, f := range t.Schema {
		if f.Required && !set[i] {
			return nil, &FieldError{f.Name, "REQUIRED, and the message has no value for it"}
		}
	}
	return proto.Marshal(m)
}

func pick(obj map[string]any, names []string) map[string]any {
	out := make(map[string]any, len(names))
	for _, n := range names {
		if v, ok := obj[n]; ok {
			out[n] = v
		}
	}
	return out
}

// fill sets m's fields from a JSON object's fields by column name; set
// marks the columns given a value.
func fill(m *dynamicpb.Message, s bigquery.Schema, obj map[string]any, o Options, path string, set []bool) error {
	fds := m.Descriptor().Fields()
	for name, v := range obj {
		i := column(s, name)
		if i < 0 {
			if o.DropUnknownFields {
				continue
			}
			return &FieldError{path + name, "the table has no such column (drop_unknown_fields is off)"}
		}
		f, fd := s[i], fds.ByNumber(protoreflect.FieldNumber(i+1))
		if v == nil {
			continue // NULL; a REQUIRED column is reported by the caller
		}
		col := path + f.Name
		if f.Repeated {
			arr, ok := v.([]any)
			if !ok {
				return &FieldError{col, "ARRAY, and the message has " + kindOf(v)}
			}
			l := m.Mutable(fd).List()
			for j, e := range arr {
				pv, err := fromJSON(m, fd, f, e, o, fmt.Sprintf("%s[%d]", col, j))
				if err != nil {
					return err
				}
				l.Append(pv)
			}
		} else {
			pv, err := fromJSON(m, fd, f, v, o, col)
			if err != nil {
				return err
			}
			m.Set(fd, pv)
		}
		if set != nil {
			set[i] = true
		}
	}
	return nil
}

// fromJSON converts one JSON value (from a decoder with UseNumber) to the
// column's proto value.
func fromJSON(m *dynamicpb.Message, fd protoreflect.FieldDescriptor, f *bigquery.FieldSchema, v any, o Options, col string) (protoreflect.Value, error) {
	bad := func(why string) (protoreflect.Value, error) {
		return protoreflect.Value{}, &FieldError{col, why}
	}
	mismatch := func() (protoreflect.Value, error) {
		return bad(fmt.Sprintf("%s, and the message has %s", f.Type, kindOf(v)))
	}
	if v == nil {
		return bad("an ARRAY holds no NULL")
	}
	s, isStr := v.(string)
	n, isNum := v.(json.Number)
	switch f.Type {
	case bigquery.StringFieldType, bigquery.GeographyFieldType, bigquery.DateTimeFieldType, bigquery.TimeFieldType:
		if !isStr {
			return mismatch()
		}
		return protoreflect.ValueOfString(s), nil
	case bigquery.NumericFieldType, bigquery.BigNumericFieldType:
		switch {
		case isStr:
			return protoreflect.ValueOfString(s), nil
		case isNum:
			return protoreflect.ValueOfString(n.String()), nil
		}
		return mismatch()
	case bigquery.BytesFieldType:
		if !isStr {
			return mismatch()
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return bad("BYTES, and the message's string is not base64")
		}
		return protoreflect.ValueOfBytes(b), nil
	case bigquery.IntegerFieldType:
		if isNum {
			s = n.String()
		} else if !isStr {
			return mismatch()
		}
		i, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return bad(fmt.Sprintf("INTEGER, and %q is not a 64-bit integer", s))
		}
		return protoreflect.ValueOfInt64(i), nil
	case bigquery.FloatFieldType:
		if isNum {
			s = n.String()
		} else if !isStr {
			return mismatch()
		}
		x, err := strconv.ParseFloat(s, 64)
		if err != nil && !math.IsInf(x, 0) {
			return bad(fmt.Sprintf("FLOAT, and %q is not a number", s))
		}
		return protoreflect.ValueOfFloat64(x), nil
	case bigquery.BooleanFieldType:
		if b, ok := v.(bool); ok {
			return protoreflect.ValueOfBool(b), nil
		}
		if b, err := strconv.ParseBool(s); isStr && err == nil {
			return protoreflect.ValueOfBool(b), nil
		}
		return mismatch()
	case bigquery.TimestampFieldType:
		if isNum {
			us, err := n.Int64()
			if err != nil {
				return bad(fmt.Sprintf("TIMESTAMP, and %s is not whole microseconds since 1970", n))
			}
			return protoreflect.ValueOfInt64(us), nil
		}
		if !isStr {
			return mismatch()
		}
		ts, err := parseTimestamp(s)
		if err != nil {
			return bad(fmt.Sprintf("TIMESTAMP, and %q is not a timestamp", s))
		}
		return protoreflect.ValueOfInt64(ts.UnixMicro()), nil
	case bigquery.DateFieldType:
		if !isStr {
			return mismatch()
		}
		d, err := time.Parse(time.DateOnly, s)
		if err != nil {
			return bad(fmt.Sprintf("DATE, and %q is not YYYY-MM-DD", s))
		}
		return protoreflect.ValueOfInt32(int32(d.Unix() / 86400)), nil
	case bigquery.JSONFieldType:
		b, err := json.Marshal(v)
		if err != nil {
			return bad(err.Error())
		}
		return protoreflect.ValueOfString(string(b)), nil
	case bigquery.RecordFieldType:
		obj, ok := v.(map[string]any)
		if !ok {
			return mismatch()
		}
		var sub *dynamicpb.Message
		if f.Repeated {
			sub = dynamicpb.NewMessage(fd.Message())
		} else {
			sub = m.NewField(fd).Message().(*dynamicpb.Message)
		}
		if err := fill(sub, f.Schema, obj, o, col+".", nil); err != nil {
			return protoreflect.Value{}, err
		}
		for _, sf := range f.Schema {
			if sf.Required && obj[sf.Name] == nil {
				return bad("its field " + sf.Name + " is REQUIRED, and the message has no value for it")
			}
		}
		return protoreflect.ValueOfMessage(sub), nil
	}
	return bad(fmt.Sprintf("columns of type %s are not supported", f.Type))
}

// timestampLayouts are the forms BigQuery's JSON loads take for a
// TIMESTAMP; a time without a zone is UTC.
var timestampLayouts = []string{
	time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00",
	"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05.999999999 MST",
}

func parseTimestamp(s string) (time.Time, error) {
	var err error
	for _, l := range timestampLayouts {
		var ts time.Time
		if ts, err = time.Parse(l, s); err == nil {
			return ts, nil
		}
	}
	return time.Time{}, err
}

// setMeta sets a metadata value (see Value) to its column.
func setMeta(m *dynamicpb.Message, fd protoreflect.FieldDescriptor, f *bigquery.FieldSchema, v any) error {
	if !accepts(f, v) {
		return &FieldError{f.Name, fmt.Sprintf("%s, which cannot hold %s", typeName(f), kindOf(v))}
	}
	var pv protoreflect.Value
	switch x := v.(type) {
	case string:
		if f.Type == bigquery.BytesFieldType {
			pv = protoreflect.ValueOfBytes([]byte(x))
		} else {
			pv = protoreflect.ValueOfString(x)
		}
	case time.Time:
		if f.Type == bigquery.TimestampFieldType {
			pv = protoreflect.ValueOfInt64(x.UnixMicro())
		} else {
			pv = protoreflect.ValueOfString(x.UTC().Format(time.RFC3339Nano))
		}
	case json.RawMessage:
		pv = protoreflect.ValueOfString(string(x))
	case []byte:
		switch f.Type {
		case bigquery.BytesFieldType:
			pv = protoreflect.ValueOfBytes(x)
		case bigquery.StringFieldType:
			if !utf8.Valid(x) {
				return &FieldError{f.Name, "STRING, and the payload is not UTF-8"}
			}
			pv = protoreflect.ValueOfString(string(x))
		default:
			if !json.Valid(x) {
				return &FieldError{f.Name, "JSON, and the payload is not JSON"}
			}
			pv = protoreflect.ValueOfString(string(x))
		}
	}
	m.Set(fd, pv)
	return nil
}

// accepts reports whether column f can take the metadata value v.
func accepts(f *bigquery.FieldSchema, v any) bool {
	if f.Repeated {
		return false
	}
	switch v.(type) {
	case string:
		return f.Type == bigquery.StringFieldType || f.Type == bigquery.BytesFieldType
	case time.Time:
		return f.Type == bigquery.TimestampFieldType || f.Type == bigquery.StringFieldType
	case json.RawMessage:
		return f.Type == bigquery.JSONFieldType || f.Type == bigquery.StringFieldType
	case []byte:
		return f.Type == bigquery.BytesFieldType || f.Type == bigquery.StringFieldType || f.Type == bigquery.JSONFieldType
	}
	return false
}

// kindOf names a value's kind in an error.
func kindOf(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case time.Time:
		return "a time"
	case json.RawMessage:
		return "JSON"
	case []byte:
		return "bytes"
	}
	return strings.TrimPrefix(fmt.Sprintf("%T", v), "*")
}
