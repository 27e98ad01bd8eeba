package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dedupflow/dedupflow/limits"
)

// Missing is what happens to a message that lacks the id attribute.
type Missing uint8

const (
	// Fallback dedups on the service-assigned message ID, as Beam does:
	// the key is MessageIDKey(ID), "message-id:" and the ID.
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
const MaxKeyLen = limits.AttributeValueBytes

// MessageIDPrefix starts every key taken from a message ID, so that a
// keyless message never shares a key with a publisher's event: without it,
// a keyless message whose ID is 3 would be dropped as a copy of the event
// with key 3, in the store, in the audit filter, in a keyed sink and in a
// downstream reader of the output's id attribute. Publisher keys that
// start with it are refused (ErrKeyReserved).
const MessageIDPrefix = "message-id:"

// MessageIDKey is the key of a message that is deduped on its message ID.
func MessageIDKey(id string) string { return MessageIDPrefix + id }

// Errors of key derivation, for dead-letter reasons.
var (
	ErrKeyMissing  = errors.New("id attribute missing")
	ErrKeyTooLong  = errors.New("dedup key too long")
	ErrKeyInvalid  = errors.New("dedup key is not valid UTF-8")
	ErrKeyReserved = errors.New("dedup key starts with " + MessageIDPrefix + ", which keys taken from message IDs use")
)

// Source says where a derived key came from.
type Source uint8

const (
	SourceAttribute Source = iota + 1 // the id attribute
	SourceMessageID                   // no id attribute configured, or Fallback
	SourceNone                        // Pass: emit without dedup
	SourceJSON                        // a field of the JSON payload
	SourceHash                        // the payload's SHA-256
)

// Derive returns the key of a message with these attributes, payload
// (data) and message ID. Missing reports that the configured key (the id
// attribute, or the JSON field) was absent or empty, to be counted
// whatever the policy; err is set when the message must be dead-lettered.
// A key taken from the message ID is MessageIDKey(msgID).
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
// events. An empty payload has no key (every attribute-only message would
// otherwise be one duplicate of the other).
func (r *Policy) Derive(attrs map[string]string, data []byte, msgID string) (key string, src Source, missing bool, err error) {
	switch r.From {
	case KeyFromJSON:
		v, reason := jsonKey(data, r.Path)
		if reason != "" {
			return r.missingKey(msgID, &missingError{reason: reason})
		}
		if err := CheckKey(v); err != nil {
			return "", SourceNone, false, fmt.Errorf("JSON path %q: %w", r.Path, err)
		}
		return v, SourceJSON, false, nil
	case KeyFromHash:
		if len(data) == 0 {
			return r.missingKey(msgID, &missingError{reason: "payload is empty, nothing to hash"})
		}
		sum := sha256.Sum256(data)
		return hex.EncodeToString(sum[:]), SourceHash, false, nil
	}
	if r.IDAttribute == "" {
		return MessageIDKey(msgID), SourceMessageID, false, nil
	}
	v := attrs[r.IDAttribute]
	if v == "" {
		return r.missingKey(msgID, fmt.Errorf("%w: %q", ErrKeyMissing, r.IDAttribute))
	}
	if err := CheckKey(v); err != nil {
		return "", SourceNone, false, err
	}
	return v, SourceAttribute, false, nil
}

// missingKey applies the missing-id policy to a message without a key;
// reason is what the dead letter says under Reject.
func (r *Policy) missingKey(msgID string, reason error) (string, Source, bool, error) {
	switch r.Missing {
	case Reject:
		return "", SourceNone, true, reason
	case Pass:
		return "", SourceNone, true, nil
	}
	return MessageIDKey(msgID), SourceMessageID, true, nil
}

// CheckKey applies the limits every publisher's key has: it travels in an
// attribute, and the message-ID namespace is not its to use. The console's
// form calls it too, so it refuses what the pipeline refuses, in its words.
func CheckKey(v string) error {
	switch {
	case len(v) > MaxKeyLen:
		return fmt.Errorf("%w: %d bytes, at most %d", ErrKeyTooLong, len(v), MaxKeyLen)
	case !utf8.ValidString(v):
		return ErrKeyInvalid
	case strings.HasPrefix(v, MessageIDPrefix):
		return ErrKeyReserved
	}
	return nil
}
