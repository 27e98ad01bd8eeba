// Package columns is what the table sinks (Spanner, Bigtable, BigQuery)
// share about a row: the metadata columns, named as BigQuery subscriptions
// name them so the queries users already have keep working, and the fields
// of a JSON payload, taken by column name as Google's Dataflow templates
// take them.
package columns

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dedupflow/dedupflow/sink"
)

// Kind is which metadata a column holds.
type Kind int

// The metadata kinds, in the order Metadata.Columns lists them.
const (
	Key          Kind = iota // the dedup key (the message ID for a message passed without one)
	MessageID                // the input's message ID
	PublishTime              // when Pub/Sub received the message
	Attributes               // the attributes as a JSON object
	Data                     // the payload's bytes
	Subscription             // the input subscription's full name
	kinds
)

// names are the kinds as --metadata-columns spells them, and the default
// column names of all but Key: BigQuery subscriptions'.
var names = [kinds]string{"key", "message_id", "publish_time", "attributes", "data", "subscription_name"}

func (k Kind) String() string { return names[k] }

// Column is one metadata column: what it holds and its name in the table.
type Column struct {
	Kind Kind
	Name string
}

// Metadata says which metadata columns a sink writes and under which names:
// Names[k] is kind k's column, empty when it is off. The zero value writes
// none.
type Metadata struct{ Names [kinds]string }

// All is every metadata column under its default name, the key's named
// keyColumn (the pipeline's output ID attribute).
func All(keyColumn string) Metadata {
	md := Metadata{Names: names}
	md.Names[Key] = keyColumn
	return md
}

// Parse reads a list of metadata columns as --metadata-columns takes it:
// "all", "none", or kinds separated by commas, each optionally renamed as
// KIND=COLUMN (publish_time=ts). The key's default name is keyColumn.
func Parse(spec, keyColumn string) (Metadata, error) {
	switch strings.TrimSpace(spec) {
	case "all":
		return All(keyColumn), nil
	case "none", "":
		return Metadata{}, nil
	}
	def := All(keyColumn)
	var md Metadata
	for item := range strings.SplitSeq(spec, ",") {
		kind, name, renamed := strings.Cut(strings.TrimSpace(item), "=")
		k := kindOf(kind)
		switch {
		case k < 0:
			return Metadata{}, fmt.Errorf("unknown metadata column %q: want all, none or a list of %s, each optionally as KIND=COLUMN", kind, strings.Join(names[:], ", "))
		case md.Names[k] != "":
			return Metadata{}, fmt.Errorf("metadata column %s is listed twice", kind)
		case renamed && name == "":
			return Metadata{}, fmt.Errorf("metadata column %s= names no column", kind)
		case !renamed:
			name = def.Names[k]
		}
		md.Names[k] = name
	}
	seen := map[string]Kind{}
	for _, c := range md.Columns() {
		if o, ok := seen[c.Name]; ok {
			return Metadata{}, fmt.Errorf("metadata columns %s and %s are both named %q", o, c.Kind, c.Name)
		}
		seen[c.Name] = c.Kind
	}
	return md, nil
}

func kindOf(s string) Kind {
	for k, n := range names {
		if n == s {
			return Kind(k)
		}
	}
	return -1
}

// Columns are the columns that are on, in Kind order.
func (md Metadata) Columns() []Column {
	var cs []Column
	for k, n := range md.Names {
		if n != "" {
			cs = append(cs, Column{Kind(k), n})
		}
	}
	return cs
}

// Has reports whether name is one of the metadata columns.
func (md Metadata) Has(name string) bool {
	for _, n := range md.Names {
		if n != "" && n == name {
			return true
		}
	}
	return false
}

// Value is one metadata column's value for one message. V's type follows
// the kind: string for Key, MessageID and Subscription, time.Time for
// PublishTime, json.RawMessage (an object) for Attributes, []byte for Data.
type Value struct {
	Column
	V any
}

// Values are m's metadata values, in the order of Columns; subscription
// is the input subscription's full name (projects/P/subscriptions/S).
func (md Metadata) Values(m *sink.Message, subscription string) ([]Value, error) {
	cs := md.Columns()
	vs := make([]Value, len(cs))
	for i, c := range cs {
		vs[i].Column = c
		switch c.Kind {
		case Key:
			vs[i].V = KeyOf(m)
		case MessageID:
			vs[i].V = m.ID
		case PublishTime:
			vs[i].V = m.PublishTime
		case Attributes:
			b, err := attributesJSON(m.Attributes)
			if err != nil {
				return nil, fmt.Errorf("%w: column %s: %w", sink.ErrPermanent, c.Name, err)
			}
			vs[i].V = b
		case Data:
			vs[i].V = m.Data
		case Subscription:
			vs[i].V = subscription
		}
	}
	return vs, nil
}

// KeyOf is the key a row of m is written under: its dedup key, or, for a
// message passed without dedup, its message ID, which is unique per stored
// message, so a redelivery of one is still written once.
func KeyOf(m *sink.Message) string {
	if m.Key != "" {
		return m.Key
	}
	return m.ID
}

// attributesJSON is attrs as a JSON object ({} for none, as BigQuery
// subscriptions write it).
func attributesJSON(attrs map[string]string) (json.RawMessage, error) {
	if attrs == nil {
		attrs = map[string]string{}
	}
	return json.Marshal(attrs)
}
