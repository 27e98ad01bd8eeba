package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	redisstore "github.com/dedupflow/dedupflow/store/redis"
)

const (
	nameMemStore   = "dedupflow store/mem"
	nameMap        = "bare Go map[[16]byte]struct{}"
	nameNATSEntry  = "NATS JetStream dedup window entry"
	nameRedisStore = "dedupflow store/redis"
	nameSetNX      = "hand-rolled go-redis SET NX PX"
)

// benchMemory runs store/mem's BenchmarkClaimCommit (1M and 10M live
// keys; 1M only with --quick) and measures Redis's bytes per key.
func (e *env) benchMemory(ctx context.Context) error {
	lives, benchtime := "(1M|10M)", "3000000x"
	if e.cfg.quick {
		lives, benchtime = "1M", "10000x"
	}
	lines, err := goBench(ctx, e, "mem", "./store/mem/", "^BenchmarkClaimCommit$/^store=(mem|map)$/^live="+lives+"$", benchtime, e.cfg.runs, nil)
	if err != nil {
		return err
	}
	for _, live := range []string{"1M", "10M"} {
		if e.cfg.quick && live == "10M" {
			continue
		}
		group := live + " live keys"
		for _, s := range []struct {
			store, name, peer string
		}{{"mem", nameMemStore, nameMap}, {"map", nameMap, nameMemStore}} {
			bench := "BenchmarkClaimCommit/store=" + s.store + "/live=" + live
			r := row{section: "memory", group: group, name: s.name, ours: s.store == "mem", peer: s.peer,
				count: live + " keys inside the horizon, steady state", unit: "B/key", values: metricRuns(lines, bench, "B/livekey")}
			if ns := metricRuns(lines, bench, "ns/op"); len(ns) > 0 {
				r.note = fmt.Sprintf("%s ns per insert + expiry", num(row{values: ns}.median()))
			}
			if len(r.values) == 0 {
				e.fail(fmt.Errorf("memory: no B/livekey result for %s", bench))
				continue
			}
			e.add(r)
		}
	}
	e.add(row{section: "memory", group: "any size", name: nameNATSEntry, count: "—", unit: "B/key",
		fixed: "~130–150 B (NATS documentation; not measured here)"})
	if e.redisURL == "" {
		return nil
	}
	n := 200_000
	if e.cfg.quick {
		n = 5_000
	}
	group := inum(n) + " keys in Redis"
	var storeV, setnxV []float64
	for range e.cfg.runs {
		v, err := redisBytesPerKey(ctx, e.redisURL, n, true)
		if err != nil {
			return err
		}
		storeV = append(storeV, v)
		if v, err = redisBytesPerKey(ctx, e.redisURL, n, false); err != nil {
			return err
		}
		setnxV = append(setnxV, v)
	}
	cnt := "; Redis used_memory growth ÷ keys"
	e.add(row{section: "memory", group: group, name: nameRedisStore, ours: true, peer: nameSetNX,
		count: inum(n) + " keys claimed and committed through the store" + cnt, unit: "B/key", values: storeV})
	e.add(row{section: "memory", group: group, name: nameSetNX, peer: nameRedisStore,
		count: inum(n) + " keys written with SET NX PX (hex key, message ID value)" + cnt, unit: "B/key", values: setnxV})
	return nil
}

// redisBytesPerKey fills an empty Redis with n keys, through our store or
// as hand-rolled SET NX PX, and returns used_memory growth per key.
func redisBytesPerKey(ctx context.Context, url string, n int, viaStore bool) (float64, error) {
	opt, err := goredis.ParseURL(url)
	if err != nil {
		return 0, fmt.Errorf("parse redis url: %w", err)
	}
	rdb := goredis.NewClient(opt)
	defer rdb.Close()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return 0, fmt.Errorf("flush redis: %w", err)
	}
	before, err := usedMemory(ctx, rdb)
	if err != nil {
		return 0, err
	}
	key := func(i int) dedup.Key {
		var k dedup.Key
		binary.LittleEndian.PutUint64(k[:8], uint64(i)*0x9E3779B97F4A7C15+1)
		binary.LittleEndian.PutUint64(k[8:], uint64(i)*0xC2B2AE3D27D4EB4F+7)
		return k
	}
	now := time.Now()
	if viaStore {
		s, err := redisstore.Open(ctx, url, redisstore.Options{Prefix: "bm:"})
		if err != nil {
			return 0, err
		}
		var next atomic.Int64
		var wg sync.WaitGroup
		errs := make(chan error, 256)
		for range 256 {
			wg.Go(func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					k, id := key(i), strconv.Itoa(1_000_000_000+i)
					if _, err := s.Claim(ctx, dedup.Claim{Key: k, MsgID: id, Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
						errs <- err
						return
					}
					if err := s.Commit(ctx, k, id, now.Add(10*time.Minute)); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		cerr := s.Close()
		if err := <-errs; err != nil {
			return 0, fmt.Errorf("fill redis through the store: %w", err)
		}
		if cerr != nil {
			return 0, fmt.Errorf("close redis store: %w", cerr)
		}
	} else {
		for lo := 0; lo < n; lo += 500 {
			pipe := rdb.Pipeline()
			for i := lo; i < min(n, lo+500); i++ {
				pipe.SetNX(ctx, "bm:"+key(i).String(), strconv.Itoa(1_000_000_000+i), 10*time.Minute)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				return 0, fmt.Errorf("fill redis with SET NX PX: %w", err)
			}
		}
	}
	after, err := usedMemory(ctx, rdb)
	if err != nil {
		return 0, err
	}
	keys, err := rdb.DBSize(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redis dbsize: %w", err)
	}
	if keys < int64(n) {
		return 0, &correctnessError{fmt.Sprintf("redis holds %d keys after %d distinct claims", keys, n)}
	}
	return float64(after-before) / float64(keys), nil
}

func usedMemory(ctx context.Context, rdb *goredis.Client) (int64, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return 0, fmt.Errorf("redis info: %w", err)
	}
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("redis info has no used_memory")
}

// benchRedis runs store/redis's BenchmarkClaim against the bench's own
// redis-server: the store against hand-rolled SET NX PX, one server, one run.
func (e *env) benchRedis(ctx context.Context) error {
	if e.redisURL == "" {
		return nil // already reported absent
	}
	benchtime := "3s"
	if e.cfg.quick {
		benchtime = "2000x"
	}
	lines, err := goBench(ctx, e, "redis", "./store/redis/", "^BenchmarkClaim$", benchtime, e.cfg.runs,
		[]string{"DEDUPFLOW_REDIS_URL=" + e.redisURL})
	if err != nil {
		return err
	}
	const pipelined, oneByOne = nameSetNX + ", pipelines of 500", nameSetNX + ", one by one"
	for _, s := range []struct{ sub, name, peer, count string }{
		{"store", nameRedisStore, pipelined, "claims of new keys from 1000 goroutines (the store batches them)"},
		{"setnx-pipelined-500", pipelined, nameRedisStore, "SET NX PX of new keys, pipelines of 500, 4 in flight"},
		{"setnx-one-by-one", oneByOne, nameRedisStore, "SET NX PX of new keys from 1000 goroutines"},
	} {
		r := row{section: "redis", group: "new-key claims", name: s.name, ours: s.sub == "store", peer: s.peer,
			count: s.count + ", " + benchtime + " per run", unit: "ops/s", values: metricRuns(lines, "BenchmarkClaim/"+s.sub, "claims/s")}
		if len(r.values) == 0 {
			e.fail(fmt.Errorf("redis: no claims/s result for %s", s.sub))
			continue
		}
		e.add(r)
	}
	return nil
}
