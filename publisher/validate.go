package publisher

import (
	"errors"
	"fmt"
	"unicode/utf8"
)

// Limits the Pub/Sub service enforces on one message. Checking them here
// turns a publish that could never succeed into a specific error before the
// first attempt, instead of an InvalidArgument from the server (or, for
// bad UTF-8, an Internal error that looks retryable).
const (
	MaxAttributes          = 100
	MaxAttributeNameBytes  = 256
	MaxAttributeValueBytes = 1024
	// MaxKeyBytes is the limit of the key, an attribute value.
	MaxKeyBytes = MaxAttributeValueBytes
	// MaxMessageBytes bounds data plus attribute names and values.
	MaxMessageBytes = 10_000_000
)

// ErrInvalidEvent is wrapped by every error about an event that can never
// be published as it is; the specific errors below say why.
var ErrInvalidEvent = errors.New("invalid event")

// Specific reasons an event is invalid. Each comes wrapped together with
// ErrInvalidEvent, so errors.Is works with either.
var (
	ErrEmptyEvent        = errors.New("empty message: no data and no attributes")
	ErrTooManyAttributes = errors.New("too many attributes")
	ErrKeyTooLong        = errors.New("key too long")
	ErrEmptyKey          = errors.New("empty key")
	ErrKeyConflict       = errors.New("conflicting key")
	ErrAttributeName     = errors.New("invalid attribute name")
	ErrAttributeValue    = errors.New("invalid attribute value")
	ErrNotUTF8           = errors.New("not valid UTF-8")
	ErrMessageTooLarge   = errors.New("message too large")
	ErrTimestampConflict = errors.New("conflicting timestamp")
)

func invalid(reason error, format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrInvalidEvent, reason, fmt.Sprintf(format, args...))
}

// checkName reports whether name can be an attribute name.
func checkName(name string) error {
	switch {
	case name == "":
		return invalid(ErrAttributeName, "empty attribute name")
	case len(name) > MaxAttributeNameBytes:
		return invalid(ErrAttributeName, "attribute name %.40q... is %d bytes, the limit is %d", name, len(name), MaxAttributeNameBytes)
	case !utf8.ValidString(name):
		return invalid(ErrNotUTF8, "attribute name %q", name)
	}
	return nil
}

// checkKey reports whether key can be the event's key.
func checkKey(key string) error {
	switch {
	case key == "":
		return invalid(ErrEmptyKey, "the key must not be empty")
	case len(key) > MaxKeyBytes:
		return invalid(ErrKeyTooLong, "key %.40q... is %d bytes, the limit is %d (an attribute value)", key, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return invalid(ErrNotUTF8, "key %q", key)
	}
	return nil
}

// checkMessage checks the finished message: attribute count, names,
// values, and total size.
func checkMessage(data []byte, attrs map[string]string) error {
	if len(attrs) > MaxAttributes {
		return invalid(ErrTooManyAttributes, "%d attributes with the key, the limit is %d", len(attrs), MaxAttributes)
	}
	size := len(data)
	for name, v := range attrs {
		if err := checkName(name); err != nil {
			return err
		}
		if len(v) > MaxAttributeValueBytes {
			return invalid(ErrAttributeValue, "attribute %q is %d bytes, the limit is %d", name, len(v), MaxAttributeValueBytes)
		}
		if !utf8.ValidString(v) {
			return invalid(ErrNotUTF8, "value of attribute %q: %q", name, v)
		}
		size += len(name) + len(v)
	}
	if size > MaxMessageBytes {
		return invalid(ErrMessageTooLarge, "%d bytes, the limit is %d", size, MaxMessageBytes)
	}
	return nil
}
