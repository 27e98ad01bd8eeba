package columns

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/dedupflow/dedupflow/sink"
)

// Fields takes the named top-level fields of a JSON object payload, as
// Google's Pub/Sub-to-table templates map fields to columns by name. Each
// result is the field's JSON text, nil when the payload lacks it (a JSON
// null is returned as "null"; both mean NULL to a table). A payload that
// is not a JSON object fails with an error wrapping sink.ErrPermanent:
// no retry makes it fit, so it belongs in the dead-letter topic. Without
// names the payload is not read at all.
func Fields(data []byte, names []string) ([]json.RawMessage, error) {
	if len(names) == 0 {
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' {
		return nil, fmt.Errorf("%w: payload is not a JSON object, so it has no field %q", sink.ErrPermanent, names[0])
	}
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("%w: payload is not a JSON object, so it has no field %q: %w", sink.ErrPermanent, names[0], err)
	}
	out := make([]json.RawMessage, len(names))
	for i, n := range names {
		out[i] = obj[n]
	}
	return out, nil
}
