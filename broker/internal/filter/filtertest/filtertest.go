// Package filtertest holds the attribute sets the filter's tests judge: the
// filter's own table of cases, and the broker's test that delivers them
// through filtered subscriptions beside pstest.
package filtertest

// Messages returns the attribute sets, a fresh copy each call; a case
// names the indexes that pass.
func Messages() []map[string]string {
	return []map[string]string{
		0: {"lang": "en", "name": "com"},
		1: {"lang": "en", "name": "net"},
		2: {"lang": "cn", "name": "com"},
		3: {"lang": "jp"},
		4: {"name": "co"},
		5: {"iana.org/language_tag": "en", "name": "contains\"quote"},
		6: {"lang": "de-AT", "tab": "a\tb"},
		7: {"name": "€uro", "x": ""},
	}
}
