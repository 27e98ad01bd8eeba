package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"

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
		return KeyFromJSON, path, nil
	}
	return 0, "", fmt.Errorf("unknown key source %q: want attribute, json:PATH or hash", s)
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

// DeriveBody is Derive for rules that may key on the payload (data).
//
// KeyFromJSON takes the field at r.Path (gjson syntax: "order.id",
// "items.0.sku"). A string is the key as decoded; a number is its literal
// text, so 64-bit IDs keep every digit (12 and 12.0 are different keys);
// true and false are keys too. A payload that is not JSON, a path that
// is absent, or a field that is null, empty, an object or an array has no
// key: that follows r.Missing and reports missing, exactly as an absent
// id attribute does.
//
// KeyFromHash keys on the hex SHA-256 of the payload (attributes are not
// hashed, as in SQS). SHA-256 rather than a fast hash: a producer who can
// make two different payloads collide could silence another producer's
// events, and with the SHA extensions it costs about half a microsecond
// per KiB. An empty payload has no key (every attribute-only message
// would otherwise be one duplicate of the other).
func (r Rule) DeriveBody(attrs map[string]string, data []byte, msgID string) (key string, src Source, missing bool, err error) {
	switch r.From {
	case KeyFromJSON:
		v, reason := jsonKey(data, r.Path)
		if reason != "" {
			return r.missingKey(msgID, reason)
		}
		if err := checkKey(v); err != nil {
			return "", NoKey, false, fmt.Errorf("JSON path %q: %w", r.Path, err)
		}
		return v, FromJSON, false, nil
	case KeyFromHash:
		if len(data) == 0 {
			return r.missingKey(msgID, "payload is empty, nothing to hash")
		}
		sum := sha256.Sum256(data)
		return hex.EncodeToString(sum[:]), FromHash, false, nil
	}
	return r.Derive(attrs, msgID)
}

// missingKey applies the missing-id policy to a payload without a key.
func (r Rule) missingKey(msgID, reason string) (string, Source, bool, error) {
	switch r.Missing {
	case Reject:
		return "", NoKey, true, &missingError{reason: reason}
	case Pass:
		return "", NoKey, true, nil
	}
	return msgID, FromMessageID, true, nil
}

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

// checkKey applies the limits every key has: it travels in an attribute.
func checkKey(v string) error {
	if len(v) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(v), MaxKeyLen)
	}
	if !utf8.ValidString(v) {
		return ErrKeyInvalid
	}
	return nil
}
