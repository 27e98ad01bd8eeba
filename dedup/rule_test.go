package dedup

import (
	"errors"
	"strings"
	"testing"
)

func TestRuleDerive(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen+1)
	cases := []struct {
		name    string
		rule    Rule
		attrs   map[string]string
		key     string
		src     Source
		missing bool
		err     error
	}{
		{"no attribute configured: message ID", Rule{}, map[string]string{"key": "a"}, "m1", FromMessageID, false, nil},
		{"attribute present", Rule{IDAttribute: "key"}, map[string]string{"key": "456"}, "456", FromAttribute, false, nil},
		{"missing, fallback", Rule{IDAttribute: "key"}, nil, "m1", FromMessageID, true, nil},
		{"empty counts as missing", Rule{IDAttribute: "key"}, map[string]string{"key": ""}, "m1", FromMessageID, true, nil},
		{"missing, reject", Rule{IDAttribute: "key", Missing: Reject}, nil, "", NoKey, true, ErrKeyMissing},
		{"missing, pass", Rule{IDAttribute: "key", Missing: Pass}, nil, "", NoKey, true, nil},
		{"too long", Rule{IDAttribute: "key"}, map[string]string{"key": long}, "", NoKey, false, ErrKeyTooLong},
		{"longest allowed", Rule{IDAttribute: "key"}, map[string]string{"key": long[1:]}, long[1:], FromAttribute, false, nil},
		{"not UTF-8", Rule{IDAttribute: "key"}, map[string]string{"key": "\xff\xfe"}, "", NoKey, false, ErrKeyInvalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, src, missing, err := c.rule.Derive(c.attrs, "m1")
			if !errors.Is(err, c.err) || key != c.key || src != c.src || missing != c.missing {
				t.Fatalf("got (%.20q, %v, %v, %v), want (%.20q, %v, %v, %v)", key, src, missing, err, c.key, c.src, c.missing, c.err)
			}
		})
	}
}

func TestParseMissing(t *testing.T) {
	for s, want := range map[string]Missing{"fallback": Fallback, "reject": Reject, "pass": Pass} {
		if got, err := ParseMissing(s); err != nil || got != want || got.String() != s {
			t.Errorf("ParseMissing(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseMissing("drop"); err == nil || !strings.Contains(err.Error(), "fallback, reject or pass") {
		t.Errorf("ParseMissing(drop) error %v does not list the choices", err)
	}
}

func FuzzKeyOf(f *testing.F) {
	f.Add("456", "key", "m1")
	f.Add("", "key", "m2")
	f.Add("\xff", "k", "")
	f.Fuzz(func(t *testing.T, value, attr, msgID string) {
		r := Rule{IDAttribute: attr}
		key, src, _, err := r.Derive(map[string]string{attr: value}, msgID)
		if err != nil {
			if len(value) <= MaxKeyLen && (value == "" || utf8Valid(value)) && attr != "" {
				t.Fatalf("valid value %q rejected: %v", value, err)
			}
			return
		}
		if attr != "" && value != "" && (key != value || src != FromAttribute) {
			t.Fatalf("key %q from %v, want the attribute %q", key, src, value)
		}
		// Equal keys hash equal; the hash is stable across calls.
		if KeyOf(key) != KeyOf(strings.Clone(key)) {
			t.Fatal("KeyOf is not deterministic")
		}
		if key != value+"x" && KeyOf(key) == KeyOf(value+"x") {
			t.Fatalf("collision between %q and %q", key, value+"x")
		}
	})
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }
