package dedup

import (
	"errors"
	"fmt"
	"strings"

	"github.com/tidwall/gjson"
)

// KeyFrom says where a message's dedup key is.
type KeyFrom uint8

const (
	// KeyFromAttribute: the id attribute, else the message ID (the default).
	KeyFromAttribute KeyFrom = iota
	// KeyFromJSON: a field of a JSON payload, as Beam's Deduplicate
	// .withRepresentativeValueFn lets a pipeline compute the key.
	KeyFromJSON
	// KeyFromHash: the SHA-256 of the payload, as SQS FIFO's content-based
	// deduplication.
	KeyFromHash
)

// ParseKeyFrom reads a --key-from value: attribute, json:PATH or hash. It
// returns the path for json:PATH.
func ParseKeyFrom(s string) (KeyFrom, string, error) {
	switch {
	case s == "attribute" || s == "":
		return KeyFromAttribute, "", nil
	case s == "hash":
		return KeyFromHash, "", nil
	case strings.HasPrefix(s, "json:"):
		path := strings.TrimPrefix(s, "json:")
		if strings.TrimSpace(path) == "" {
			return 0, "", fmt.Errorf("--key-from %q: the JSON path is empty (want e.g. json:order.id)", s)
		}
		if err := checkPath(path); err != nil {
			return 0, "", fmt.Errorf("JSON path %q: %w (want a gjson path, e.g. json:order.id)", path, err)
		}
		return KeyFromJSON, path, nil
	}
	return 0, "", fmt.Errorf("unknown key source %q: want attribute, json:PATH or hash", s)
}

// checkPath refuses what gjson would take without complaint and match in
// no payload: an empty name between dots or pipes, and an unclosed or
// unopened bracket, so every message would count as missing its key.
func checkPath(path string) error {
	var open []byte // closers awaited, innermost last
	inString, seg := false, 0
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '\\':
			i++
			seg++
		case inString:
			inString = c != '"'
		case c == '"' && len(open) > 0:
			inString = true
		case c == '[' || c == '{' || c == '(':
			open = append(open, map[byte]byte{'[': ']', '{': '}', '(': ')'}[c])
			seg++
		case c == ']' || c == '}' || c == ')':
			if len(open) == 0 || open[len(open)-1] != c {
				return fmt.Errorf("unexpected %q at offset %d", c, i)
			}
			open = open[:len(open)-1]
			seg++
		case (c == '.' || c == '|') && len(open) == 0:
			if seg == 0 {
				return fmt.Errorf("empty name before %q at offset %d", c, i)
			}
			seg = 0
		default:
			seg++
		}
	}
	switch {
	case inString:
		return errors.New("unclosed string")
	case len(open) > 0:
		return fmt.Errorf("missing %q at the end", open[len(open)-1])
	case seg == 0:
		return errors.New("empty name at the end")
	}
	return nil
}

func (f KeyFrom) String() string {
	switch f {
	case KeyFromJSON:
		return "json"
	case KeyFromHash:
		return "hash"
	}
	return "attribute"
}

// missingError is a key that is not there for a reason more specific than
// a missing attribute; it is ErrKeyMissing to errors.Is, so callers that
// count or dead-letter missing keys treat both alike.
type missingError struct{ reason string }

func (e *missingError) Error() string        { return "dedup key missing: " + e.reason }
func (e *missingError) Is(target error) bool { return target == ErrKeyMissing }

// jsonKey returns the key at path in data, or why there is none.
func jsonKey(data []byte, path string) (string, string) {
	// gjson reads without validating; an unchecked payload such as
	// `{"id": 1` would still yield a key. Validating first costs one more
	// pass, which the benchmark counts.
	if !gjson.ValidBytes(data) {
		return "", "payload is not JSON"
	}
	v := gjson.GetBytes(data, path)
	switch v.Type {
	case gjson.String:
		if v.Str == "" {
			return "", fmt.Sprintf("JSON path %q is an empty string", path)
		}
		return v.Str, ""
	case gjson.Number, gjson.True, gjson.False:
		if v.Raw == "" { // computed by a modifier: no literal to keep
			return v.String(), ""
		}
		return v.Raw, ""
	case gjson.Null:
		if !v.Exists() {
			return "", fmt.Sprintf("JSON path %q not found", path)
		}
		return "", fmt.Sprintf("JSON path %q is null", path)
	}
	if strings.HasPrefix(v.Raw, "[") {
		return "", fmt.Sprintf("JSON path %q is an array, not a scalar", path)
	}
	return "", fmt.Sprintf("JSON path %q is an object, not a scalar", path)
}
