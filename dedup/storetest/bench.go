package storetest

import (
	"context"
	"encoding/binary"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

// A Meter measures a benchmark's timed loop beyond ns/op: it is called as
// the loop starts and returns the function that reports its figures, called
// as the loop ends. A caller passes the one its machine has (this project
// reports the process's CPU time per op); nil measures nothing more.
type Meter func(b *testing.B) (report func())

func (m Meter) start(b *testing.B) func() {
	if m == nil {
		return func() {}
	}
	return m(b)
}

// Callers of the single calls and batch size of the batch calls in Bench:
// the official client's callbacks call a store from as many goroutines as
// it has messages outstanding; the batch path calls it per StreamingPull
// response, from a few streams.
const (
	benchCallers = 1000
	benchStreams = 4
	benchBatch   = 500
)

var benchSeq atomic.Uint64

// BenchKey is a fresh key without SHA-256's cost, unlike any an earlier run
// left in a shared server, for a store's benchmarks.
func BenchKey() dedup.Key {
	var k dedup.Key
	n := benchSeq.Add(1) + uint64(time.Now().UnixNano())<<20
	binary.LittleEndian.PutUint64(k[:8], n*0x9E3779B97F4A7C15)
	binary.LittleEndian.PutUint64(k[8:], n*0xC2B2AE3D27D4EB4F+1)
	return k
}

// Bench measures one op, a claim of a new key and its commit, through the
// single calls from 1000 goroutines ("single") and through the batch calls
// in batches of 500 from 4 goroutines ("batch"), in one run, so that their
// ratio is taken under the same load. It reports ops/s and what m
// measures. open is called once per sub-benchmark.
func Bench(b *testing.B, open func(b *testing.B) dedup.Store, m Meter) {
	b.Run("single", func(b *testing.B) { ClaimCommit(b, open(b), m) })
	b.Run("batch", func(b *testing.B) { benchBatches(b, open(b), m) })
}

// ClaimCommit measures one op, a claim of a new key and its commit, through
// s's single calls from 1000 goroutines, as the official client's callbacks
// call a store; it reports ops/s and what m measures.
func ClaimCommit(b *testing.B, s dedup.Store, m Meter) {
	ctx := context.Background()
	b.SetParallelism((benchCallers + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	report := m.start(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			k, now := BenchKey(), time.Now()
			if _, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: "17760522123456789", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
				b.Error(err)
				return
			}
			if err := s.Commit(ctx, k, "17760522123456789", now.Add(time.Hour)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	report()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}

func benchBatches(b *testing.B, s dedup.Store, m Meter) {
	ctx := context.Background()
	b.SetParallelism(max(1, benchStreams/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	report := m.start(b)
	b.RunParallel(func(pb *testing.PB) {
		cs := make([]dedup.Claim, 0, benchBatch)
		es := make([]dedup.Entry, benchBatch)
		vs, errs := make([]dedup.Verdict, benchBatch), make([]error, benchBatch)
		flush := func() bool {
			n := len(cs)
			dedup.ClaimBatch(ctx, s, cs, vs[:n], errs[:n])
			for i, c := range cs {
				es[i] = dedup.Entry{Key: c.Key, MsgID: c.MsgID, Expires: c.Now.Add(time.Hour)}
			}
			if err := errors.Join(errs[:n]...); err != nil {
				b.Error(err)
				return false
			}
			dedup.CommitBatch(ctx, s, es[:n], errs[:n])
			if err := errors.Join(errs[:n]...); err != nil {
				b.Error(err)
				return false
			}
			cs = cs[:0]
			return true
		}
		for pb.Next() {
			now := time.Now()
			cs = append(cs, dedup.Claim{Key: BenchKey(), MsgID: "17760522123456789", Now: now, LeaseUntil: now.Add(time.Minute)})
			if len(cs) == benchBatch && !flush() {
				return
			}
		}
		if len(cs) > 0 {
			flush()
		}
	})
	report()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
}
