package redis

import (
	"context"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// callers is how many goroutines call the store at once, as the pipeline
// does under load.
const callers = 1000

// clean removes what earlier runs left under bench:, outside the timer:
// millions of keys from the previous contender, expiring in the
// background, cost Redis CPU the next one would pay for (the same
// pipelined run measured 252k then 100k claims/s without it).
func clean(b *testing.B, rdb *goredis.Client) {
	ctx := context.Background()
	var cursor uint64
	for {
		keys, next, err := rdb.Scan(ctx, cursor, "bench:*", 10_000).Result()
		if err != nil {
			b.Fatal(err)
		}
		if len(keys) > 0 {
			if err := rdb.Unlink(ctx, keys...).Err(); err != nil {
				b.Fatal(err)
			}
		}
		if cursor = next; cursor == 0 {
			return
		}
	}
}

func parallel(b *testing.B, n int) {
	b.SetParallelism((n + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
}

// BenchmarkClaim compares, against one server in one run, a claim of a
// new key through the store (1000 callers), the ceiling a hand-rolled
// dedup reaches (SET NX PX in pipelines of 500, four in flight, as many as
// the store's batchers) and the same SET NX PX sent one by one from 1000
// goroutines.
//
//	go test -run '^$' -bench 'Claim$' -benchtime 3s ./store/redis
func BenchmarkClaim(b *testing.B) {
	url := testenv.RedisURL(b)
	opt, err := goredis.ParseURL(url)
	if err != nil {
		b.Fatal(err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	ctx := context.Background()
	b.Run("store", func(b *testing.B) {
		clean(b, rdb)
		s := open(b, url, Options{Prefix: "bench:"})
		now := time.Now()
		parallel(b, callers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Claim(ctx, dedup.Claim{Key: storetest.BenchKey(), MsgID: "17760522123456789", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
	})
	b.Run("setnx-pipelined-500", func(b *testing.B) {
		clean(b, rdb)
		parallel(b, 4)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			pipe := rdb.Pipeline()
			n := 0
			flush := func() {
				if _, err := pipe.Exec(ctx); err != nil {
					b.Error(err)
				}
				n = 0
			}
			for pb.Next() {
				k := storetest.BenchKey()
				pipe.SetNX(ctx, "bench:"+k.String(), "p1776052212345:17760522123456789", time.Minute)
				if n++; n == 500 {
					flush()
				}
			}
			if n > 0 {
				flush()
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
	})
	b.Run("setnx-one-by-one", func(b *testing.B) {
		clean(b, rdb)
		parallel(b, callers)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				k := storetest.BenchKey()
				if err := rdb.SetNX(ctx, "bench:"+k.String(), "p1776052212345:17760522123456789", time.Minute).Err(); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "claims/s")
	})
}

// BenchmarkClaimCommit: a claim of a new key and its commit, 1000 callers.
//
//	go test -run '^$' -bench ClaimCommit -benchtime 3s ./store/redis
func BenchmarkClaimCommit(b *testing.B) {
	storetest.ClaimCommit(b, open(b, testenv.RedisURL(b), Options{Prefix: "bench:"}), testenv.CPUPerOp)
}

// BenchmarkCommitWait: a claim of a new key and its commit, 1000 callers,
// against a master and one replica of the benchmark's own, with and
// without wait=1 (each commit confirmed by the replica) in the same run.
//
//	go test -run '^$' -bench CommitWait -benchtime 3s ./store/redis
func BenchmarkCommitWait(b *testing.B) {
	url, _, _ := startReplicated(b)
	for _, q := range []string{"wait=0", "wait=1"} {
		b.Run(q, func(b *testing.B) {
			storetest.ClaimCommit(b, open(b, url+"?"+q, Options{Prefix: "bench:"}), testenv.CPUPerOp)
		})
	}
}

// BenchmarkSlidingCopy: republished copies on the sliding horizon, from
// 1000 callers: each claim finds its key done and moves its expiry later.
//
//	go test -run '^$' -bench SlidingCopy -benchtime 3s ./store/redis
func BenchmarkSlidingCopy(b *testing.B) {
	s := open(b, testenv.RedisURL(b), Options{Prefix: "bench:"})
	ctx, now := context.Background(), time.Now()
	keys := make([]dedup.Key, 10_000)
	for i := range keys {
		keys[i] = storetest.BenchKey()
		if _, err := s.Claim(ctx, dedup.Claim{Key: keys[i], MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
			b.Fatal(err)
		}
		if err := s.Commit(ctx, keys[i], "m", now.Add(time.Hour)); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Int64
	parallel(b, callers)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := seq.Add(1)
			c := dedup.Claim{Key: keys[n%int64(len(keys))], MsgID: "copy", Now: now, LeaseUntil: now.Add(time.Minute),
				Extend: now.Add(time.Hour + time.Duration(n)*time.Millisecond)}
			if v, err := s.Claim(ctx, c); err != nil || v.Status != dedup.Duplicate {
				b.Errorf("copy: %v, %v", v.Status, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "copies/s")
}

// BenchmarkBatch: claim+commit of new keys through the single calls (1000
// callers, coalesced by the batcher) and the batch calls (4 callers,
// batches of 500, one pipeline each) in one run.
//
//	go test -run '^$' -bench Batch -benchtime 3s ./store/redis
func BenchmarkBatch(b *testing.B) {
	url := testenv.RedisURL(b)
	storetest.Bench(b, func(b *testing.B) dedup.Store { return open(b, url, Options{Prefix: "bench:"}) }, testenv.CPUPerOp)
}
