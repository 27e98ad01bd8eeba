package filter

import (
	"slices"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/broker/internal/filter/filtertest"
	"github.com/dedupflow/dedupflow/broker/internal/wire"
)

func TestFilterTable(t *testing.T) {
	messages := filtertest.Messages()
	for _, c := range []struct {
		filter string
		want   []int
	}{
		{`attributes:lang`, []int{0, 1, 2, 3, 6}},
		{`attributes:"lang"`, []int{0, 1, 2, 3, 6}},
		{`attributes:nope`, nil},
		{`attributes.lang = "en"`, []int{0, 1}},
		{`attributes.lang="en"`, []int{0, 1}},
		{`attributes.lang != "en"`, []int{2, 3, 4, 5, 6, 7}}, // != is true when the key is absent
		{`attributes.name = "contains\"quote"`, []int{5}},
		{`attributes."iana.org/language_tag" = "en"`, []int{5}},
		{`attributes:"iana.org/language_tag"`, []int{5}},
		{`attributes.tab = "a\tb"`, []int{6}},
		{`attributes.tab = "a\x09b"`, []int{6}},
		{`attributes.tab = "a\011b"`, []int{6}},
		{`attributes.name = "\u20acuro"`, []int{7}},
		{`attributes.x = ""`, []int{7}},
		{`hasPrefix(attributes.name, "co")`, []int{0, 2, 4, 5}},
		{`hasPrefix( attributes."name" , "" )`, []int{0, 1, 2, 4, 5, 7}},
		{`hasPrefix(attributes.lang, "de-")`, []int{6}},
		{`NOT attributes:name`, []int{3, 6}},
		{`-attributes:name`, []int{3, 6}},
		{`NOT NOT attributes:name`, []int{0, 1, 2, 4, 5, 7}},
		{`attributes.name = "com" AND -attributes:"lang"`, nil},
		{`attributes.lang = "en" AND attributes.name = "com"`, []int{0}},
		{`attributes.lang = "en" OR attributes.lang = "jp" OR attributes:x`, []int{0, 1, 3, 7}},
		{`(NOT attributes:name) OR attributes.name = "co"`, []int{3, 4, 6}},
		{`NOT (attributes:name OR attributes.lang = "jp")`, []int{6}},
		{`attributes:lang AND (attributes.name = "com" OR attributes.name = "net")`, []int{0, 1, 2}},
		{`(attributes.lang = "en" AND attributes.name = "net") OR (attributes.lang = "cn")`, []int{1, 2}},
		{"attributes:lang\n\tAND\nattributes:name", []int{0, 1, 2}},
		{`attributes:lang-x`, nil}, // '-' belongs to the key
	} {
		f, err := Parse(c.filter)
		if err != nil {
			t.Errorf("%s: %v", c.filter, err)
			continue
		}
		var got []int
		for i, attrs := range messages {
			if f.Match(wire.Body([]byte("d"), attrs)) {
				got = append(got, i)
			}
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: passes %v, want %v", c.filter, got, c.want)
		}
	}
}

func TestFilterSyntaxErrors(t *testing.T) {
	for _, c := range []struct{ filter, want string }{
		{`attributes.name = "com" AND attributes:a OR attributes:b`, `at offset 41: AND and OR cannot be mixed without parentheses`},
		{`attributes:a OR attributes:b AND attributes:c`, `at offset 29: AND and OR cannot be mixed`},
		{`attributes.name = $`, `at offset 18: expected a string in double quotes, found '$'`},
		{`attributes.name = `, `at offset 18: expected a string in double quotes, found end of filter`},
		{`attributes.name = com`, `expected a string in double quotes, found "com"`},
		{`(attributes.name = "com"`, `at offset 24: expected ')', found end of filter`},
		{`hasPrefix(attributes.name)`, `at offset 25: expected ',' after the key in hasPrefix`},
		{`hasPrefix("x", "y")`, `hasPrefix takes attributes.KEY first`},
		{`attributes:a and attributes:b`, `at offset 13: "and": the operators AND, OR and NOT are written in upper case`},
		{`attributes.name == "x"`, `at offset 17: expected a string in double quotes, found '='`},
		{`attributes.name > "x"`, `at offset 16: expected = or != after attributes.name, found '>'`},
		{`attributes.name = "unterminated`, `at offset 18: the string that starts here has no closing quote`},
		{`attributes.name = "bad \q escape"`, `at offset 23: invalid escape in a string`},
		{`attributes:`, `at offset 11: expected an attribute key, found end of filter`},
		{`attrs:a`, `at offset 0: expected attributes:KEY, attributes.KEY, hasPrefix(...), NOT or '(', found "attrs"`},
		{`attributes:a attributes:b`, `at offset 13: unexpected "attributes"`},
		{`attributes`, `at offset 10: expected ':' or '.' after attributes, found end of filter`},
		{`NOT`, `at offset 3: expected attributes:KEY`},
		{`data = "x"`, `at offset 0: expected attributes:KEY`},
		{`attributes.a = "x")`, `at offset 18: unexpected ')'`},
		{`attributes:a AND`, `at offset 16: expected attributes:KEY`},
		{"attributes:" + strings.Repeat("k", 246), `the filter is 257 bytes, the limit is 256`},
	} {
		_, err := Parse(c.filter)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.filter, err, c.want)
		}
	}
	if f, err := Parse("attributes:" + strings.Repeat("k", 245)); err != nil || f == nil {
		t.Errorf("a filter of exactly 256 bytes: %v", err)
	}
}

func TestFilterMatchAllocatesNothing(t *testing.T) {
	f, err := Parse(`attributes:lang AND (hasPrefix(attributes.name, "co") OR attributes.x != "y") AND NOT attributes.lang = "jp"`)
	if err != nil {
		t.Fatal(err)
	}
	body := wire.Body([]byte("data"), filtertest.Messages()[0])
	if n := testing.AllocsPerRun(1000, func() { f.Match(body) }); n != 0 {
		t.Errorf("match allocates %v times per message, want 0", n)
	}
}

// BenchmarkFilterMatch measures one match of a filter with four terms
// against a message with three attributes.
func BenchmarkFilterMatch(b *testing.B) {
	f, err := Parse(`attributes:lang AND (hasPrefix(attributes.name, "co") OR attributes.x != "y") AND NOT attributes.lang = "jp"`)
	if err != nil {
		b.Fatal(err)
	}
	body := wire.Body([]byte("data"), map[string]string{"lang": "en", "name": "com", "id": "12345"})
	b.ReportAllocs()
	for b.Loop() {
		f.Match(body)
	}
}
