package table

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

func keyN(i uint64) dedup.Key {
	var k dedup.Key
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	binary.LittleEndian.PutUint64(k[:8], z^z>>31)
	binary.LittleEndian.PutUint64(k[8:], z*0x9e3779b97f4a7c15)
	return k
}

// BenchmarkGrow: one op is a key claimed and committed in a table that
// grows from empty, as a store's does after it starts.
//
//	go test -run '^$' -bench Grow -benchtime 2000000x ./store/internal/table
func BenchmarkGrow(b *testing.B) {
	t := New(0)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := 0; b.Loop(); i++ {
		k := keyN(uint64(i))
		t.Claim(k, 1, now, now+int64(time.Minute), 0)
		t.Commit(k, 1, now+int64(time.Hour))
	}
}
