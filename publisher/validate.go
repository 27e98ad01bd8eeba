package publisher

import (
	"errors"
	"fmt"

	"github.com/dedupflow/dedupflow/limits"
)

// Limits the Pub/Sub service enforces on one message, as package limits
// defines them. Checking them here turns a publish that could never succeed
// into a specific error before the first attempt, instead of an
// InvalidArgument from the server (or, for bad UTF-8, an Internal error
// that looks retryable).
//
// Deprecated: use the constants of package limits.
const (
	MaxAttributes          = limits.Attributes
	MaxAttributeNameBytes  = limits.AttributeKeyBytes
	MaxAttributeValueBytes = limits.AttributeValueBytes
	// MaxKeyBytes is the limit of the key, an attribute value.
	MaxKeyBytes = limits.AttributeValueBytes
	// MaxMessageBytes bounds data, attribute names and values and the
	// ordering key.
	MaxMessageBytes = limits.MessageBytes
)

// ErrInvalidEvent is wrapped by every error about an event that can never
// be published as it is; the specific errors below say why.
var ErrInvalidEvent = errors.New("invalid event")

// Specific reasons an event is invalid. Each comes wrapped together with
// ErrInvalidEvent, so errors.Is works with either. The ones Pub/Sub's
// limits decide are package limits' own sentinels.
var (
	// ErrEmptyEvent is the publisher's own rule, stricter than Pub/Sub's:
	// the key attribute alone does not make an event.
	ErrEmptyEvent        = errors.New("empty message: no data and no attributes")
	ErrTooManyAttributes = limits.ErrTooManyAttributes
	ErrKeyTooLong        = errors.New("key too long")
	ErrEmptyKey          = errors.New("empty key")
	ErrKeyConflict       = errors.New("conflicting key")
	ErrAttributeName     = limits.ErrAttributeKey
	ErrAttributeValue    = limits.ErrAttributeValue
	ErrNotUTF8           = limits.ErrNotUTF8
	ErrMessageTooLarge   = limits.ErrTooLarge
	ErrTimestampConflict = errors.New("conflicting timestamp")
)

func invalid(reason error, format string, args ...any) error {
	return fmt.Errorf("%w: %w: %s", ErrInvalidEvent, reason, fmt.Sprintf(format, args...))
}

// refused marks an error of package limits as an invalid event.
func refused(err error) error { return fmt.Errorf("%w: %w", ErrInvalidEvent, err) }

// checkName reports whether name can be an attribute name.
func checkName(name string) error {
	if err := limits.AttributeKey(name); err != nil {
		return refused(err)
	}
	return nil
}

// checkKey reports whether key can be the event's key, the value of
// attribute attr.
func checkKey(attr, key string) error {
	if key == "" {
		return invalid(ErrEmptyKey, "the key must not be empty")
	}
	if err := limits.AttributeValue(attr, key); err != nil {
		if !errors.Is(err, ErrNotUTF8) {
			err = fmt.Errorf("%w: %w", ErrKeyTooLong, err)
		}
		return refused(err)
	}
	return nil
}

// checkMessage checks the finished message as the service will.
func checkMessage(data []byte, attrs map[string]string, orderingKey string) error {
	if _, err := limits.Message(data, attrs, orderingKey); err != nil {
		return refused(err)
	}
	return nil
}
