package mem_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/store/mem"
)

// keyN is the i-th key of a benchmark: cheap to make, so the benchmark
// measures the table, not the hash.
func keyN(i uint64) dedup.Key {
	var k dedup.Key
	z := i + 0x9e3779b97f4a7c15
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	binary.LittleEndian.PutUint64(k[:8], z^z>>31)
	binary.LittleEndian.PutUint64(k[8:], z*0x9e3779b97f4a7c15)
	return k
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkClaimCommit measures one new key per operation (claim + commit)
// in steady state: the clock moves so that exactly `live` keys are inside
// the horizon, so every insert is matched by an expiry. The bare map does
// the same work with no claim protocol: look up, insert, delete the key
// that fell out of the horizon.
//
//	go test -run '^$' -bench ClaimCommit -benchtime 3000000x ./store/mem/
func BenchmarkClaimCommit(b *testing.B) {
	for _, live := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("store=mem/live=%dM", live/1_000_000), func(b *testing.B) { benchMem(b, live) })
		b.Run(fmt.Sprintf("store=map/live=%dM", live/1_000_000), func(b *testing.B) { benchMap(b, live) })
	}
}

func benchMem(b *testing.B, live int) {
	ctx := context.Background()
	const horizon = 10 * time.Minute
	step := horizon / time.Duration(live)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	before := heap()
	s := mem.New()
	const id = "17263545263541234"
	put := func(i int) {
		k := keyN(uint64(i))
		c := dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(time.Minute)}
		if v, _ := s.Claim(ctx, c); v.Status != dedup.Proceed {
			b.Fatalf("key %d: %v", i, v.Status)
		}
		_ = s.Commit(ctx, k, id, now.Add(horizon))
		now = now.Add(step)
	}
	for i := 0; i < live; i++ {
		put(i)
	}
	perKey := float64(heap()-before) / float64(live)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		put(live + i)
	}
	b.StopTimer()
	b.ReportMetric(perKey, "B/livekey")
	if n := s.Len(); n > live+live/8 {
		b.Fatalf("%d keys held with %d live: expiry is not keeping up", n, live)
	}
	runtime.KeepAlive(s)
}

func benchMap(b *testing.B, live int) {
	before := heap()
	m := make(map[[16]byte]struct{})
	put := func(i int) {
		k := keyN(uint64(i))
		if _, ok := m[k]; ok {
			b.Fatal("collision")
		}
		m[k] = struct{}{}
		if i >= live {
			delete(m, keyN(uint64(i-live)))
		}
	}
	for i := 0; i < live; i++ {
		put(i)
	}
	perKey := float64(heap()-before) / float64(live)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		put(live + i)
	}
	b.StopTimer()
	b.ReportMetric(perKey, "B/livekey")
	runtime.KeepAlive(m)
}

// BenchmarkBatch: claim+commit of new keys through the single calls (1000
// callers) and the batch calls (4 callers, batches of 500) in one run.
//
//	go test -run '^$' -bench Batch -benchtime 3s ./store/mem
func BenchmarkBatch(b *testing.B) {
	storetest.Bench(b, func(*testing.B) dedup.Store { return mem.New() }, testenv.CPUPerOp)
}
