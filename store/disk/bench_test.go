package disk

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/store/mem"
)

// BenchmarkClaimCommit: one op is a claim of a new key and its commit, from
// 1000 goroutines; the memory store runs in the same benchmark for the
// ratio.
//
//	go test -run '^$' -bench ClaimCommit -benchtime 3s ./store/disk
func BenchmarkClaimCommit(b *testing.B) {
	disk := func(b *testing.B, opt Options) {
		s := open(b, filepath.Join(b.TempDir(), "s.db"), opt)
		storetest.ClaimCommit(b, s, testenv.CPUPerOp)
		if txs := s.w.txs.Load(); txs > 0 {
			b.ReportMetric(float64(s.w.keys.Load())/float64(txs), "keys/tx")
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(txs), "µs/tx")
		}
	}
	b.Run("mem", func(b *testing.B) { storetest.ClaimCommit(b, mem.New(), testenv.CPUPerOp) })
	b.Run("disk", func(b *testing.B) { disk(b, Options{}) })
	b.Run("disk-nosync", func(b *testing.B) { disk(b, Options{NoSync: true}) })
}

// BenchmarkReopen times Open of a file holding N live keys (default 1M;
// DEDUPFLOW_BENCH_KEYS=10000000 for the 10M figure, by hand: it writes a
// database of ~280 MB and takes a minute to build; DEDUPFLOW_BENCH_FILE=PATH
// keeps it between runs).
//
//	DEDUPFLOW_BENCH_KEYS=10000000 go test -run '^$' -bench Reopen -benchtime 3x -timeout 30m ./store/disk
func BenchmarkReopen(b *testing.B) {
	n := 1_000_000
	if v := os.Getenv("DEDUPFLOW_BENCH_KEYS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil {
			b.Fatal(err)
		}
	}
	path := filepath.Join(b.TempDir(), "s.db")
	if p := os.Getenv("DEDUPFLOW_BENCH_FILE"); p != "" {
		path = p // kept between runs: built once, when missing
	}
	if _, err := os.Stat(path); err != nil {
		s := open(b, path, Options{})
		fill(b, s, n, time.Now().Add(24*time.Hour))
		s.Close()
	}
	var size int64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				size += fi.Size()
			}
		}
		return nil
	})
	b.ReportMetric(float64(size)/float64(n), "file-bytes/key")
	var ms runtime.MemStats
	var cpu time.Duration
	var alloc uint64
	b.ResetTimer()
	for b.Loop() {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		cpu0 := testenv.CPUTime()
		s, err := Open(context.Background(), path, Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		// CPU time too: on a shared machine the wall clock says more
		// about the neighbours than about Open.
		cpu += testenv.CPUTime() - cpu0
		runtime.GC()
		runtime.ReadMemStats(&ms)
		if got := s.Len(); got != n {
			b.Fatalf("reopened %d keys, want %d", got, n)
		}
		b.ReportMetric(float64(ms.HeapAlloc-before.HeapAlloc)/float64(n), "heap-bytes/key")
		// What Open allocates in all, kept or not: the start-up peak a
		// memory limit has to allow for, beyond what stays.
		alloc += ms.TotalAlloc - before.TotalAlloc
		s.Close()
		b.StartTimer()
	}
	b.ReportMetric(float64(n), "keys")
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(alloc)/float64(b.N)/(1<<20), "alloc-MiB/op")
}

// cpuTime is the CPU time (user and system) the process has used.
// fill writes n committed keys straight into the database as groups of
// 1000, as a busy store writes them: building ten million keys through
// Commit would measure the commit path, not the reopen.
func fill(b *testing.B, s *Store, n int, exp time.Time) {
	const group, perBatch = 1000, 200
	base := exp.UnixNano()
	for done := 0; done < n; {
		bt := s.w.db.NewBatch()
		for range perBatch {
			m := min(group, n-done)
			if m == 0 {
				break
			}
			v := make([]byte, m*recLen)
			var maxExp int64
			for i := range m {
				r := rec{exp: base + int64(done+i)*1000, tag: 1}
				putRec(v[i*recLen:], storetest.BenchKey(), r)
				maxExp = r.exp
			}
			s.w.seq++
			k := make([]byte, groupKeyLen)
			groupKey(k, maxExp, s.w.seq)
			if err := bt.Set(k, v, nil); err != nil {
				b.Fatal(err)
			}
			done += m
		}
		if err := bt.Commit(pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		bt.Close()
	}
}

// BenchmarkBatch: claim+commit of new keys through the single calls (1000
// callers, whose commits share group commits) and the batch calls (4
// callers, batches of 500, one group each) in one run.
//
//	go test -run '^$' -bench Batch -benchtime 3s ./store/disk
func BenchmarkBatch(b *testing.B) {
	storetest.Bench(b, func(b *testing.B) dedup.Store {
		return open(b, filepath.Join(b.TempDir(), "db"), Options{})
	}, testenv.CPUPerOp)
}
