package dedup

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

func TestRuleDerive(t *testing.T) {
	long := strings.Repeat("k", MaxKeyLen+1)
	cases := []struct {
		name    string
		rule    Policy
		attrs   map[string]string
		key     string
		src     Source
		missing bool
		err     error
	}{
		{"no attribute configured: message ID", Policy{}, map[string]string{"key": "a"}, MessageIDKey("m1"), SourceMessageID, false, nil},
		{"attribute present", Policy{IDAttribute: "key"}, map[string]string{"key": "456"}, "456", SourceAttribute, false, nil},
		{"missing, fallback", Policy{IDAttribute: "key"}, nil, MessageIDKey("m1"), SourceMessageID, true, nil},
		{"empty counts as missing", Policy{IDAttribute: "key"}, map[string]string{"key": ""}, MessageIDKey("m1"), SourceMessageID, true, nil},
		{"missing, reject", Policy{IDAttribute: "key", Missing: Reject}, nil, "", SourceNone, true, ErrKeyMissing},
		{"missing, pass", Policy{IDAttribute: "key", Missing: Pass}, nil, "", SourceNone, true, nil},
		{"too long", Policy{IDAttribute: "key"}, map[string]string{"key": long}, "", SourceNone, false, ErrKeyTooLong},
		{"longest allowed", Policy{IDAttribute: "key"}, map[string]string{"key": long[1:]}, long[1:], SourceAttribute, false, nil},
		{"not UTF-8", Policy{IDAttribute: "key"}, map[string]string{"key": "\xff\xfe"}, "", SourceNone, false, ErrKeyInvalid},
		{"a publisher's key in the message-ID namespace", Policy{IDAttribute: "key"}, map[string]string{"key": "message-id:m1"}, "", SourceNone, false, ErrKeyReserved},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, src, missing, err := c.rule.Derive(c.attrs, nil, "m1")
			if !errors.Is(err, c.err) || key != c.key || src != c.src || missing != c.missing {
				t.Fatalf("got (%.20q, %v, %v, %v), want (%.20q, %v, %v, %v)", key, src, missing, err, c.key, c.src, c.missing, c.err)
			}
		})
	}
}

// TestKeylessNeverMeetsKeyed is the namespace rule for every key source: a
// message without a key, deduped on its message ID, never gets the key of
// a publisher's event, even when the event's key is that very ID.
func TestKeylessNeverMeetsKeyed(t *testing.T) {
	for _, r := range []Policy{
		{IDAttribute: "event_id"},
		{From: KeyFromJSON, Path: "order_id"},
		{From: KeyFromHash},
	} {
		t.Run(r.From.String(), func(t *testing.T) {
			// The keyed event: its key is "3" (or, for the hash, whatever
			// the payload "3" hashes to).
			keyed, _, _, err := r.Derive(map[string]string{"event_id": "3"}, []byte(`{"order_id": 3}`), "1")
			if err != nil {
				t.Fatal(err)
			}
			// A keyless message whose message ID equals that key.
			keyless, src, missing, err := r.Derive(nil, nil, keyed)
			if err != nil || src != SourceMessageID || !missing {
				t.Fatalf("keyless message: %q, %v, %v, %v", keyless, src, missing, err)
			}
			if keyless == keyed || KeyOf(keyless) == KeyOf(keyed) {
				t.Fatalf("keyless message with ID %q got the keyed event's key %q", keyed, keyless)
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
		r := Policy{IDAttribute: attr}
		key, src, _, err := r.Derive(map[string]string{attr: value}, nil, msgID)
		if err != nil {
			if len(value) <= MaxKeyLen && (value == "" || utf8Valid(value)) && attr != "" && !strings.HasPrefix(value, MessageIDPrefix) {
				t.Fatalf("valid value %q rejected: %v", value, err)
			}
			return
		}
		if attr != "" && value != "" && (key != value || src != SourceAttribute) {
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

func TestDeriveBody(t *testing.T) {
	sha := func(s string) string {
		sum := sha256.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	order := []byte(`{"order":{"id":"A-17","n":12345678901234567890,"f":1.50,"ok":true,"none":null,"obj":{"a":1},"arr":[1],"empty":""},"items":[{"sku":"x"}]}`)
	long := []byte(`{"id":"` + strings.Repeat("k", MaxKeyLen+1) + `"}`)
	jsonRule := func(path string) Policy { return Policy{From: KeyFromJSON, Path: path} }
	cases := []struct {
		name    string
		rule    Policy
		data    []byte
		key     string
		src     Source
		missing bool
		err     error
		reason  string // in the error, for rejects
	}{
		{"json string", jsonRule("order.id"), order, "A-17", SourceJSON, false, nil, ""},
		{"json number keeps every digit", jsonRule("order.n"), order, "12345678901234567890", SourceJSON, false, nil, ""},
		{"json float as written", jsonRule("order.f"), order, "1.50", SourceJSON, false, nil, ""},
		{"json bool", jsonRule("order.ok"), order, "true", SourceJSON, false, nil, ""},
		{"json array index", jsonRule("items.0.sku"), order, "x", SourceJSON, false, nil, ""},
		{"escaped string decoded", jsonRule("id"), []byte(`{"id":"a\u00e9\"b"}`), "aé\"b", SourceJSON, false, nil, ""},
		{"absent field falls back", jsonRule("order.nope"), order, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"null falls back", jsonRule("order.none"), order, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"object falls back", jsonRule("order.obj"), order, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"array falls back", jsonRule("order.arr"), order, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"empty string falls back", jsonRule("order.empty"), order, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"not JSON falls back", jsonRule("id"), []byte("<html>id</html>"), MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"truncated JSON falls back", jsonRule("id"), []byte(`{"id": 1`), MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"empty payload falls back", jsonRule("id"), nil, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"binary payload falls back", jsonRule("id"), []byte{0xff, 0x00, 0x7b}, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"absent, reject", Policy{From: KeyFromJSON, Path: "order.nope", Missing: Reject}, order, "", SourceNone, true, ErrKeyMissing, `JSON path "order.nope" not found`},
		{"null, reject", Policy{From: KeyFromJSON, Path: "order.none", Missing: Reject}, order, "", SourceNone, true, ErrKeyMissing, "is null"},
		{"object, reject", Policy{From: KeyFromJSON, Path: "order.obj", Missing: Reject}, order, "", SourceNone, true, ErrKeyMissing, "is an object"},
		{"not JSON, reject", Policy{From: KeyFromJSON, Path: "id", Missing: Reject}, []byte("plain"), "", SourceNone, true, ErrKeyMissing, "not JSON"},
		{"absent, pass", Policy{From: KeyFromJSON, Path: "x", Missing: Pass}, order, "", SourceNone, true, nil, ""},
		{"json key too long", jsonRule("id"), long, "", SourceNone, false, ErrKeyTooLong, ""},
		{"json key not UTF-8", jsonRule("id"), []byte("{\"id\":\"\xff\"}"), "", SourceNone, false, ErrKeyInvalid, ""},
		{"hash", Policy{From: KeyFromHash}, []byte("hello"), sha("hello"), SourceHash, false, nil, ""},
		{"hash of binary", Policy{From: KeyFromHash}, []byte{0, 1, 2}, sha("\x00\x01\x02"), SourceHash, false, nil, ""},
		{"hash ignores attributes", Policy{From: KeyFromHash, IDAttribute: "key"}, []byte("hello"), sha("hello"), SourceHash, false, nil, ""},
		{"hash of nothing falls back", Policy{From: KeyFromHash}, nil, MessageIDKey("m1"), SourceMessageID, true, nil, ""},
		{"hash of nothing, reject", Policy{From: KeyFromHash, Missing: Reject}, []byte{}, "", SourceNone, true, ErrKeyMissing, "payload is empty"},
		{"attribute rule ignores the body", Policy{IDAttribute: "key"}, order, "456", SourceAttribute, false, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key, src, missing, err := c.rule.Derive(map[string]string{"key": "456"}, c.data, "m1")
			if !errors.Is(err, c.err) || key != c.key || src != c.src || missing != c.missing {
				t.Fatalf("got (%.30q, %v, %v, %v), want (%.30q, %v, %v, %v)", key, src, missing, err, c.key, c.src, c.missing, c.err)
			}
			if c.reason != "" && !strings.Contains(err.Error(), c.reason) {
				t.Fatalf("error %q does not say %q", err, c.reason)
			}
		})
	}
}

// Derive keeps working for callers without the payload: a body rule then
// has no key, and follows the missing-id policy.
func TestDeriveOnBodyRuleWithoutPayload(t *testing.T) {
	r := Policy{From: KeyFromJSON, Path: "id"}
	if key, src, missing, err := r.Derive(map[string]string{"id": "x"}, nil, "m1"); key != MessageIDKey("m1") || src != SourceMessageID || !missing || err != nil {
		t.Fatalf("Derive on a JSON rule = %q, %v, %v, %v; want the message-ID fallback, counted missing", key, src, missing, err)
	}
}

func TestParseKeyFrom(t *testing.T) {
	cases := []struct {
		in   string
		from KeyFrom
		path string
		err  string
	}{
		{"", KeyFromAttribute, "", ""},
		{"attribute", KeyFromAttribute, "", ""},
		{"hash", KeyFromHash, "", ""},
		{"json:order.id", KeyFromJSON, "order.id", ""},
		{"json:", 0, "", "path is empty"},
		{"json: ", 0, "", "path is empty"},
		{"sha1", 0, "", "attribute, json:PATH or hash"},
		{"json:order..id[", 0, "", `empty name before '.' at offset 6`},
		{"json:order.id[", 0, "", `missing ']' at the end`},
		{"json:order.", 0, "", "empty name at the end"},
		{"json:.id", 0, "", "empty name before '.'"},
		{"json:a)", 0, "", "unexpected ')'"},
		{`json:items.#(name=="x)").id`, KeyFromJSON, `items.#(name=="x)").id`, ""},
		{`json:fav\.movie`, KeyFromJSON, `fav\.movie`, ""},
		{"json:children|@reverse|0", KeyFromJSON, "children|@reverse|0", ""},
		{"json:friends.#.first", KeyFromJSON, "friends.#.first", ""},
	}
	for _, c := range cases {
		from, path, err := ParseKeyFrom(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseKeyFrom(%q) error %v, want one saying %q", c.in, err, c.err)
			}
			continue
		}
		if err != nil || from != c.from || path != c.path {
			t.Errorf("ParseKeyFrom(%q) = %v, %q, %v", c.in, from, path, err)
		}
	}
}

// FuzzJSONKey: any payload and path give a key, a counted miss or a named
// error — never a panic — and a key found is one the output attribute can
// carry.
func FuzzJSONKey(f *testing.F) {
	f.Add([]byte(`{"order":{"id":"A-17"}}`), "order.id")
	f.Add([]byte(`{"id":12345678901234567890}`), "id")
	f.Add([]byte(`[{"a":null}]`), "0.a")
	f.Add([]byte(`{"a":{"b":[1,2,{"c":"d"}]}}`), "a.b.#.c")
	f.Add([]byte(`{"a":"\ud800"}`), "a")
	f.Add([]byte("not json"), "@this")
	f.Add([]byte(`{"a":1}`), "a|@reverse")
	f.Fuzz(func(t *testing.T, data []byte, path string) {
		for _, m := range []Missing{Fallback, Reject, Pass} {
			r := Policy{From: KeyFromJSON, Path: path, Missing: m}
			key, src, missing, err := r.Derive(nil, data, "m1")
			switch {
			case err != nil:
				if !errors.Is(err, ErrKeyMissing) && !errors.Is(err, ErrKeyTooLong) && !errors.Is(err, ErrKeyInvalid) {
					t.Fatalf("unnamed error %v", err)
				}
				if errors.Is(err, ErrKeyMissing) && (m != Reject || !missing) {
					t.Fatalf("missing key rejected under policy %v", m)
				}
			case src == SourceJSON:
				if key == "" || len(key) > MaxKeyLen || !utf8Valid(key) || missing {
					t.Fatalf("bad key %q (missing %v)", key, missing)
				}
				if !json.Valid(data) {
					t.Fatalf("key %q taken from invalid JSON %q", key, data)
				}
			case !missing:
				t.Fatalf("no key and not missing: %q, %v", key, src)
			}
		}
	})
}
