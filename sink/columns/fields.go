package columns

import (
	"bytes"
	"encoding/json"
	"fmt"

	"github.com/tidwall/gjson"

	"github.com/dedupflow/dedupflow/sink"
)

// Fields takes the named top-level fields of a JSON object payload, as
// Google's Pub/Sub-to-table templates map fields to columns by name. Each
// result is the field's JSON text, nil when the payload lacks it (a JSON
// null is returned as "null"; both mean NULL to a table); of a name given
// twice in the payload, the last. A payload that is not a JSON object
// fails with an error wrapping sink.ErrPermanent: no retry makes it fit,
// so it belongs in the dead-letter topic. Without names the payload is
// not read at all.
//
// Names are matched literally, never as paths: a field named "a.b" is that
// field, not b inside a. The object is scanned once with gjson: a quarter
// of the CPU of decoding it into a map, 4 allocations instead of 21
// (BenchmarkFields).
func Fields(data []byte, names []string) ([]json.RawMessage, error) {
	if len(names) == 0 {
		return nil, nil
	}
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' || !gjson.ValidBytes(t) {
		return nil, fmt.Errorf("%w: payload is not a JSON object, so it has no field %q", sink.ErrPermanent, names[0])
	}
	out := make([]json.RawMessage, len(names))
	gjson.ParseBytes(data).ForEach(func(k, v gjson.Result) bool {
		for i, n := range names {
			if k.Str == n {
				out[i] = json.RawMessage(v.Raw)
			}
		}
		return true
	})
	return out, nil
}
