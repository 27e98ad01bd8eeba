package bigtable

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

// RowKey is a row key template: text with {key} (the dedup key),
// {message_id}, {attributes.NAME} (an attribute) and {data.NAME} (a
// top-level field of a JSON payload) in it, as Dataflow templates build
// keys from a message. "{key}" is the default: one row per dedup key.
type RowKey struct {
	parts  []part
	fields []string // the JSON fields it reads
}

// part is literal text, or one value of the message.
type part struct {
	lit  string
	kind string // "": literal; else key, message_id, attributes or data
	name string // the attribute or field
}

// ParseRowKey reads a template; the empty one is "{key}".
func ParseRowKey(tmpl string) (RowKey, error) {
	if tmpl == "" {
		tmpl = "{key}"
	}
	var rk RowKey
	rest := tmpl
	for rest != "" {
		open := strings.IndexByte(rest, '{')
		if open < 0 {
			rk.parts = append(rk.parts, part{lit: rest})
			break
		}
		if open > 0 {
			rk.parts = append(rk.parts, part{lit: rest[:open]})
		}
		end := strings.IndexByte(rest[open:], '}')
		if end < 0 {
			return RowKey{}, fmt.Errorf("row key template %q: a { is not closed", tmpl)
		}
		ref := rest[open+1 : open+end]
		rest = rest[open+end+1:]
		kind, name, dotted := strings.Cut(ref, ".")
		switch {
		case !dotted && (kind == "key" || kind == "message_id"):
		case dotted && name != "" && kind == "attributes":
		case dotted && name != "" && kind == "data":
			rk.fields = append(rk.fields, name)
		default:
			return RowKey{}, fmt.Errorf("row key template %q: unknown {%s}: want {key}, {message_id}, {attributes.NAME} or {data.NAME}", tmpl, ref)
		}
		rk.parts = append(rk.parts, part{kind: kind, name: name})
	}
	return rk, nil
}

// maxRowKey is Bigtable's limit on a row key, in bytes.
const maxRowKey = 4096

// key is m's row key; fields are the payload's fields rk.fields names.
// A value the template needs and the message lacks is a permanent error.
func (rk RowKey) key(m *sink.Message, fields []json.RawMessage) (string, error) {
	var b strings.Builder
	fi := 0
	for _, p := range rk.parts {
		switch p.kind {
		case "":
			b.WriteString(p.lit)
		case "key":
			b.WriteString(columns.KeyOf(m))
		case "message_id":
			b.WriteString(m.ID)
		case "attributes":
			v, ok := m.Attributes[p.name]
			if !ok {
				return "", fmt.Errorf("%w: row key: no attribute %s", sink.ErrPermanent, p.name)
			}
			b.WriteString(v)
		case "data":
			v := cellValue(fields[fi])
			fi++
			if v == nil {
				return "", fmt.Errorf("%w: row key: no field %s in the payload", sink.ErrPermanent, p.name)
			}
			b.Write(v)
		}
	}
	switch {
	case b.Len() == 0:
		return "", fmt.Errorf("%w: row key is empty", sink.ErrPermanent)
	case b.Len() > maxRowKey:
		return "", fmt.Errorf("%w: row key is %d bytes, over Bigtable's %d", sink.ErrPermanent, b.Len(), maxRowKey)
	}
	return b.String(), nil
}

// cellValue is a JSON field as a cell holds it: a string's text, any other
// value's JSON; nil for a missing field or null, which writes no cell.
func cellValue(raw json.RawMessage) []byte {
	if raw == nil || string(raw) == "null" {
		return nil
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return []byte(s)
		}
	}
	return raw
}
