package dedup

import (
	"fmt"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// payload1K is a 1 KiB JSON order with the key field first or last, so the
// benchmark shows both ends of gjson's early exit (validation always reads
// the whole payload).
func payload1K(keyLast bool) []byte {
	var items []string
	for i := 0; i < 12; i++ {
		items = append(items, fmt.Sprintf(`{"sku":"SKU-%05d","qty":%d,"price":%d.99}`, i, i%7+1, i*3))
	}
	body := `"customer":{"name":"Ada Lovelace","email":"ada@example.com"},"items":[` + strings.Join(items, ",") + `],"note":"`
	id := `"id":"ord-7f3c9a2e-1b44-4d0e-9c61-2f8a5b7d9e10"`
	head, tail := `{"order":{`+id+`,`, `"}}`
	if keyLast {
		head, tail = `{"order":{`, `",`+id+`}}`
	}
	pad := 1024 - len(head) - len(body) - len(tail)
	return []byte(head + body + strings.Repeat("x", pad) + tail)
}

// BenchmarkDeriveBody is the cost per message of the body key rules on a
// 1 KiB payload, and of KeyOf, which every rule pays after it.
//
//	go test -run '^$' -bench DeriveBody -benchmem ./dedup/
func BenchmarkDeriveBody(b *testing.B) {
	for _, c := range []struct {
		name string
		rule Policy
		data []byte
	}{
		{"rule=attribute", Policy{IDAttribute: "key"}, payload1K(false)},
		{"rule=json/field=first", Policy{From: KeyFromJSON, Path: "order.id"}, payload1K(false)},
		{"rule=json/field=last", Policy{From: KeyFromJSON, Path: "order.id"}, payload1K(true)},
		{"rule=hash", Policy{From: KeyFromHash}, payload1K(false)},
	} {
		attrs := map[string]string{"key": "ord-7f3c9a2e-1b44-4d0e-9c61-2f8a5b7d9e10"}
		if key, src, _, err := c.rule.Derive(attrs, c.data, "m1"); err != nil || src == SourceMessageID || len(c.data) != 1024 {
			b.Fatalf("%s: %q %v %v (%d bytes)", c.name, key, src, err, len(c.data))
		}
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.data)))
			b.ReportAllocs()
			done := testenv.CPUPerOp(b)
			for b.Loop() {
				key, _, _, _ := c.rule.Derive(attrs, c.data, "m1")
				_ = KeyOf(key)
			}
			done()
		})
	}
}
