package postgres

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/sink"
)

// row is one message as the columns hold it. Everything that PostgreSQL
// could refuse is settled here, before the row joins a batch: one bad
// message must not fail the statement that carries 499 good ones.
type row struct {
	key        string
	messageID  string
	data       []byte
	dataJSON   json.RawMessage // nil: NULL (the payload is not JSON jsonb accepts)
	attributes json.RawMessage
	eventTime  time.Time
	publish    time.Time
}

// errInvalid marks input the table cannot hold; it wraps sink.ErrPermanent
// so the pipeline dead-letters the message instead of retrying it forever.
var errInvalid = fmt.Errorf("%w: not storable in PostgreSQL", sink.ErrPermanent)

// encode turns a message into a row. Messages passed without dedup (an empty
// key, the --missing-id pass policy) are keyed on their message ID, which is
// unique per stored message: a redelivery of one is still written once.
func encode(m *sink.Message) (row, error) {
	key := m.Key
	if key == "" {
		key = m.ID
	}
	if key == "" {
		return row{}, fmt.Errorf("%w: message has neither a key nor a message ID", errInvalid)
	}
	if err := textOK(key); err != nil {
		return row{}, fmt.Errorf("%w: key %q: %w", errInvalid, key, err)
	}
	if err := textOK(m.ID); err != nil {
		return row{}, fmt.Errorf("%w: message ID %q: %w", errInvalid, m.ID, err)
	}
	attrs, err := encodeAttributes(m.Attributes)
	if err != nil {
		return row{}, err
	}
	data := m.Data
	if data == nil {
		data = []byte{} // the column is NOT NULL; an empty payload is legal in Pub/Sub
	}
	return row{
		key:        key,
		messageID:  m.ID,
		data:       data,
		dataJSON:   jsonbOf(data),
		attributes: attrs,
		eventTime:  m.EventTime,
		publish:    m.PublishTime,
	}, nil
}

// textOK reports why s cannot be a PostgreSQL text value (UTF-8 database
// encoding): text never holds NUL, and must be valid UTF-8.
func textOK(s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return errors.New("contains a NUL byte")
	}
	if !utf8.ValidString(s) {
		return errors.New("is not valid UTF-8")
	}
	return nil
}

// encodeAttributes renders attributes as a JSON object for the jsonb column.
// A value jsonb cannot hold as a string — one with a NUL (legal in Pub/Sub,
// refused by jsonb) or invalid UTF-8 — is stored as {"base64": "..."} so no
// byte is lost: a reader tells the two apart by the JSON type (string or
// object). Attribute names have no such escape (an object would make them
// ambiguous), so a name jsonb cannot hold makes the message permanent-invalid.
func encodeAttributes(attrs map[string]string) (json.RawMessage, error) {
	obj := make(map[string]any, len(attrs))
	for k, v := range attrs {
		if err := textOK(k); err != nil {
			return nil, fmt.Errorf("%w: attribute name %q: %w", errInvalid, k, err)
		}
		if textOK(v) != nil {
			obj[k] = map[string]string{"base64": base64.StdEncoding.EncodeToString([]byte(v))}
			continue
		}
		obj[k] = v
	}
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("%w: attributes: %w", errInvalid, err)
	}
	return b, nil
}

// jsonbOf returns data for the data_json column when jsonb will take it, else
// nil. The data column keeps the exact bytes either way: jsonb normalises
// (key order, duplicate keys, whitespace), so it cannot be the only copy.
// Checked here: JSON syntax, UTF-8, and the \u0000 escape that jsonb refuses.
// What is left (numbers beyond numeric's range, nesting beyond the server's
// stack) is caught per row when a batch fails; see Sink.isolate.
func jsonbOf(data []byte) json.RawMessage {
	if len(data) == 0 || !utf8.Valid(data) || bytes.Contains(data, []byte(`\u0000`)) || !json.Valid(data) {
		return nil
	}
	return data
}
