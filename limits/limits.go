// Package limits holds Pub/Sub's limits on messages and resource names, as
// the service documents them, and the checks that apply them. The broker,
// the publisher, the pipeline, the consumer, the console and the command all
// use these, so a message or a name that one of them accepts is one the
// service accepts too.
package limits

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The service's limits.
const (
	// MessageBytes bounds one message: its data, attribute keys and values
	// and ordering key (10 MB, as the service documents it, not 10 MiB).
	MessageBytes = 10_000_000
	// RequestBytes bounds one publish request.
	RequestBytes = 10_000_000
	// RequestMessages bounds the messages of one publish request.
	RequestMessages = 1000
	// SchemaDefinitionBytes bounds the definition of a schema revision.
	SchemaDefinitionBytes = 300_000
	Attributes            = 100
	AttributeKeyBytes     = 256
	AttributeValueBytes   = 1024
	OrderingKeyBytes      = 1024
	// MinIDLen and MaxIDLen bound a topic, subscription, snapshot or
	// schema ID.
	MinIDLen = 3
	MaxIDLen = 255
	// FilterBytes bounds a subscription's filter expression.
	FilterBytes = 256
	// Reserved starts attribute keys and resource IDs that only the
	// service may use.
	Reserved = "goog"
	// LabelsPerResource bounds the labels of a topic, subscription or
	// snapshot, and LabelChars the characters of each key and value.
	LabelsPerResource = 64
	LabelChars        = 63
	// ProjectChars bounds a project ID.
	ProjectChars = 30
)

// Sentinels that callers branch on; every error below wraps one of them.
var (
	ErrEmptyMessage      = errors.New("a message needs non-empty data or at least one attribute")
	ErrTooManyAttributes = errors.New("too many attributes")
	ErrAttributeKey      = errors.New("invalid attribute key")
	ErrAttributeValue    = errors.New("invalid attribute value")
	ErrOrderingKey       = errors.New("invalid ordering key")
	ErrTooLarge          = errors.New("message too large")
	ErrID                = errors.New("invalid resource ID")
	ErrLabel             = errors.New("invalid label")
	ErrProject           = errors.New("invalid project ID")
	// ErrNotUTF8 is wrapped, beside the sentinel of the part, by every
	// error about text that is not valid UTF-8.
	ErrNotUTF8 = errors.New("not valid UTF-8")
)

// AttributeKey checks an attribute key: not empty, at most
// AttributeKeyBytes, valid UTF-8, and not starting with "goog".
func AttributeKey(k string) error {
	switch {
	case k == "":
		return fmt.Errorf("%w: empty", ErrAttributeKey)
	case len(k) > AttributeKeyBytes:
		return fmt.Errorf("%w: %.40q... is %d bytes, the limit is %d", ErrAttributeKey, k, len(k), AttributeKeyBytes)
	case !utf8.ValidString(k):
		return fmt.Errorf("%w: %q is %w", ErrAttributeKey, k, ErrNotUTF8)
	case hasReserved(k):
		return fmt.Errorf("%w: %q starts with %q, which is reserved by Pub/Sub", ErrAttributeKey, k, Reserved)
	}
	return nil
}

// AttributeValue checks the value v of attribute k: at most
// AttributeValueBytes, valid UTF-8.
func AttributeValue(k, v string) error {
	switch {
	case len(v) > AttributeValueBytes:
		return fmt.Errorf("%w: the value of %q is %d bytes, the limit is %d", ErrAttributeValue, k, len(v), AttributeValueBytes)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: the value of %q is %w", ErrAttributeValue, k, ErrNotUTF8)
	}
	return nil
}

// Message checks a whole message and returns its size as the service
// counts it (data, attribute keys and values, ordering key).
func Message(data []byte, attrs map[string]string, orderingKey string) (int, error) {
	if len(data) == 0 && len(attrs) == 0 {
		return 0, ErrEmptyMessage
	}
	if len(attrs) > Attributes {
		return 0, fmt.Errorf("%w: %d, the limit is %d", ErrTooManyAttributes, len(attrs), Attributes)
	}
	size := len(data) + len(orderingKey)
	for k, v := range attrs {
		if err := AttributeKey(k); err != nil {
			return 0, err
		}
		if err := AttributeValue(k, v); err != nil {
			return 0, err
		}
		size += len(k) + len(v)
	}
	if len(orderingKey) > OrderingKeyBytes {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrOrderingKey, len(orderingKey), OrderingKeyBytes)
	}
	if !utf8.ValidString(orderingKey) {
		return 0, fmt.Errorf("%w: %w", ErrOrderingKey, ErrNotUTF8)
	}
	if size > MessageBytes {
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, size, MessageBytes)
	}
	return size, nil
}

// ID checks a topic, subscription, snapshot or schema ID: 3 to 255
// characters, starting with a letter, of letters, digits and - _ . ~ + %,
// and not starting with "goog".
func ID(id string) error {
	if len(id) < MinIDLen || len(id) > MaxIDLen {
		return fmt.Errorf("%w: it must be %d to %d characters long, not %d", ErrID, MinIDLen, MaxIDLen, len(id))
	}
	if c := id[0]; !letter(c) {
		return fmt.Errorf("%w: it must start with a letter", ErrID)
	}
	if hasReserved(id) {
		return fmt.Errorf("%w: it must not start with %q", ErrID, Reserved)
	}
	for _, c := range id {
		if c >= utf8.RuneSelf || !letter(byte(c)) && !('0' <= c && c <= '9') && !strings.ContainsRune("-_.~+%", c) {
			return fmt.Errorf("%w: it may hold only letters, digits and - _ . ~ + %%, not %q", ErrID, c)
		}
	}
	return nil
}

func letter(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }

func hasReserved(s string) bool {
	return len(s) >= len(Reserved) && strings.EqualFold(s[:len(Reserved)], Reserved)
}

// Labels checks the labels of a resource, by Google Cloud's rules: at most
// LabelsPerResource of them; keys of 1 to LabelChars characters that start with a
// lowercase letter, values of at most LabelChars; both made of lowercase
// letters (international ones included), digits, _ and -.
func Labels(labels map[string]string) error {
	if len(labels) > LabelsPerResource {
		return fmt.Errorf("%w: %d labels, the limit is %d", ErrLabel, len(labels), LabelsPerResource)
	}
	for k, v := range labels {
		switch r, _ := utf8.DecodeRuneInString(k); {
		case k == "":
			return fmt.Errorf("%w: an empty key", ErrLabel)
		case !unicode.IsLetter(r) || !lowerOrUncased(r):
			return fmt.Errorf("%w: key %q must start with a lowercase letter", ErrLabel, k)
		}
		for _, part := range []struct{ what, s string }{{"key", k}, {"value", v}} {
			if err := labelText(part.s); err != nil {
				return fmt.Errorf("%w: %s %q %w", ErrLabel, part.what, part.s, err)
			}
		}
	}
	return nil
}

func labelText(s string) error {
	if !utf8.ValidString(s) {
		return ErrNotUTF8
	}
	if n := utf8.RuneCountInString(s); n > LabelChars {
		return fmt.Errorf("is %d characters long, the limit is %d", n, LabelChars)
	}
	for _, r := range s {
		if !(unicode.IsLetter(r) && lowerOrUncased(r) || unicode.IsDigit(r) || r == '_' || r == '-') {
			return fmt.Errorf("may hold only lowercase letters, digits, _ and -, not %q", r)
		}
	}
	return nil
}

// lowerOrUncased is true of lowercase letters and of letters without case
// (as most international ones are).
func lowerOrUncased(r rune) bool { return !unicode.IsUpper(r) && !unicode.IsTitle(r) }

// Project checks a project ID by Google Cloud's rules: lowercase letters,
// digits and hyphens, starting with a letter, not ending with a hyphen, at
// most ProjectChars; an older domain-scoped ID ("example.com:my-project")
// may carry its domain before a colon. The service's minimum of 6
// characters is not applied: emulators, and the tests of the clients, use
// shorter IDs like "p" or "test".
func Project(id string) error {
	if i := strings.LastIndexByte(id, ':'); i >= 0 {
		domain := id[:i]
		if domain == "" || strings.Trim(domain, "abcdefghijklmnopqrstuvwxyz0123456789-.") != "" {
			return fmt.Errorf("%w: %q: the domain of a domain-scoped ID is a lowercase host name", ErrProject, id)
		}
		id = id[i+1:]
	}
	switch {
	case id == "" || len(id) > ProjectChars:
		return fmt.Errorf("%w: %q must be 1 to %d characters long", ErrProject, id, ProjectChars)
	case id[0] < 'a' || id[0] > 'z':
		return fmt.Errorf("%w: %q must start with a lowercase letter", ErrProject, id)
	case strings.HasSuffix(id, "-"):
		return fmt.Errorf("%w: %q must not end with a hyphen", ErrProject, id)
	case strings.Trim(id, "abcdefghijklmnopqrstuvwxyz0123456789-") != "":
		return fmt.Errorf("%w: %q may hold only lowercase letters, digits and hyphens", ErrProject, id)
	}
	return nil
}
