package audit_test

import (
	"runtime"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// BenchmarkFilter is the audit's cost per message in steady state at 10M
// keys per 7-day horizon and the default rate: the filter is first filled
// to capacity with keys spread over the horizon, then each operation is
// what the pipeline does per emitted message — a lookup of a key the
// filter has not seen (the common case) and an add. It reports the
// filter's memory, measured on the heap, per key and in total.
//
//	go test -run '^$' -bench Filter -benchtime 2000000x ./audit/
func BenchmarkFilter(b *testing.B) {
	capacity := benchCapacity
	horizon := 7 * 24 * time.Hour
	before := heapBytes()
	f, err := audit.New(audit.Options{Horizon: horizon, Capacity: uint(capacity)})
	if err != nil {
		b.Fatal(err)
	}
	heap := heapBytes() - before
	step := horizon / time.Duration(capacity)
	at := t0
	for i := 0; i < capacity; i++ {
		f.Add(keyN(uint64(i)), at)
		at = at.Add(step)
	}
	hits := 0
	b.ResetTimer()
	done := testenv.CPUPerOp(b)
	for i := 0; i < b.N; i++ {
		k := keyN(uint64(capacity + i))
		if f.Contains(k, at) {
			hits++
		}
		f.Add(k, at)
		at = at.Add(step)
	}
	b.StopTimer()
	done()
	st := f.Stats()
	b.ReportMetric(float64(heap)/(1<<20), "MiB-heap")
	b.ReportMetric(float64(st.Bytes)/(1<<20), "MiB-filter")
	b.ReportMetric(float64(st.Bytes*8)/float64(capacity), "bits/key")
	b.ReportMetric(float64(hits)/float64(b.N), "fp-rate")
	runtime.KeepAlive(f)
}

func heapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

var benchCapacity = 10_000_000
