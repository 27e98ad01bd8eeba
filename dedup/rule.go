package dedup

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Missing is what happens to a message that lacks the id attribute.
type Missing uint8

const (
	// Fallback dedups on the service-assigned message ID, as Beam does.
	Fallback Missing = iota
	// Reject sends the message to the dead-letter topic with a reason.
	Reject
	// Pass emits the message without dedup.
	Pass
)

// ParseMissing reads a --missing-id value.
func ParseMissing(s string) (Missing, error) {
	switch s {
	case "fallback", "":
		return Fallback, nil
	case "reject":
		return Reject, nil
	case "pass":
		return Pass, nil
	}
	return 0, fmt.Errorf("unknown missing-id policy %q: want fallback, reject or pass", s)
}

func (m Missing) String() string {
	return [...]string{"fallback", "reject", "pass"}[m]
}

// MaxKeyLen is the longest key accepted: outputs carry the key in an
// attribute, and Pub/Sub allows attribute values up to 1024 bytes.
const MaxKeyLen = 1024

// Errors of key derivation, for dead-letter reasons.
var (
	ErrKeyMissing = errors.New("id attribute missing")
	ErrKeyTooLong = errors.New("dedup key too long")
	ErrKeyInvalid = errors.New("dedup key is not valid UTF-8")
)

// Rule chooses a message's dedup key.
type Rule struct {
	// IDAttribute names the publisher-set key; empty means the message ID.
	// Used only when From is KeyFromAttribute.
	IDAttribute string
	Missing     Missing
	// From says where the key is: an attribute (the default), a field of a
	// JSON payload (at Path), or a hash of the payload. See DeriveBody.
	From KeyFrom
	// Path is the gjson path of the key field, for KeyFromJSON.
	Path string
}

// Source says where a derived key came from.
type Source uint8

const (
	FromAttribute Source = iota + 1
	FromMessageID        // no id attribute configured, or Fallback
	NoKey                // Pass: emit without dedup
	FromJSON             // a field of the JSON payload
	FromHash             // the payload's SHA-256
)

// Derive returns the key for a message. Missing reports that the id
// attribute was configured but absent or empty (to be counted whatever the
// policy); err is set when the message must be dead-lettered. For a rule
// that keys on the payload it is DeriveBody with no payload, so the key is
// missing; callers that have the payload use DeriveBody.
func (r Rule) Derive(attrs map[string]string, msgID string) (key string, src Source, missing bool, err error) {
	if r.From != KeyFromAttribute {
		return r.DeriveBody(attrs, nil, msgID)
	}
	if r.IDAttribute == "" {
		return msgID, FromMessageID, false, nil
	}
	v := attrs[r.IDAttribute]
	if v == "" {
		switch r.Missing {
		case Reject:
			return "", NoKey, true, fmt.Errorf("%w: %q", ErrKeyMissing, r.IDAttribute)
		case Pass:
			return "", NoKey, true, nil
		}
		return msgID, FromMessageID, true, nil
	}
	if len(v) > MaxKeyLen {
		return "", NoKey, false, fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(v), MaxKeyLen)
	}
	if !utf8.ValidString(v) {
		return "", NoKey, false, ErrKeyInvalid
	}
	return v, FromAttribute, false, nil
}
