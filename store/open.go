// Package store opens the dedup store named by a --state spec:
//
//	mem                                 in memory (default); forgotten on restart
//	file:PATH                           a Pebble database, a folder (store/disk); survives restarts and kill -9
//	redis://[user:pass@]host:port/db    Redis (store/redis); shared by replicas
//	rediss://...                        the same over TLS
//
// Redis URLs take go-redis's query options (dial_timeout, pool_size, ...)
// and three of ours: prefix= (key prefix, default "dedupflow:"),
// cluster=true (Redis Cluster; more seed nodes with addr=host:port) and
// wait=N (claims and commits return once N replicas confirm them).
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/store/disk"
	"github.com/dedupflow/dedupflow/store/mem"
	"github.com/dedupflow/dedupflow/store/redis"
)

// Options configure Open.
type Options struct {
	// Logger is handed to the store; nil discards.
	Logger *slog.Logger
	// Horizon, when set, is checked against what the store can hold, so a
	// bad --horizon fails at start with a clear message.
	Horizon time.Duration
	// EventTime says the horizon runs on event time: stores that free keys
	// on their own wall clock (Redis) keep them a horizon longer, so a
	// watermark that falls behind the wall clock does not outlive them.
	EventTime bool
}

// Open opens the store named by spec. Close the returned io.Closer when
// done (it flushes and stops the store's goroutines). Stores that can count
// their keys implement interface{ Len() int }, for a gauge.
func Open(ctx context.Context, spec string, opt Options) (dedup.Store, io.Closer, error) {
	kind, arg, err := parse(spec)
	if err != nil {
		return nil, nil, err
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Horizon > 0 {
		if maxH := maxHorizon(kind); opt.Horizon > maxH {
			return nil, nil, fmt.Errorf("horizon %v is longer than the %s store holds (%v)", opt.Horizon, kind, maxH)
		}
	}
	log := opt.Logger.With("state", kind)
	switch kind {
	case kindMem:
		return mem.New(), nopCloser{}, nil
	case kindFile:
		s, err := disk.Open(ctx, arg, disk.Options{Logger: log})
		if err != nil {
			return nil, nil, err
		}
		return s, s, nil
	case kindRedis:
		ro := redis.Options{Logger: log}
		if opt.EventTime {
			ro.TTLSlack = max(opt.Horizon, time.Minute)
		}
		s, err := redis.Open(ctx, arg, ro)
		if err != nil {
			return nil, nil, err
		}
		return s, s, nil
	}
	panic("unreachable")
}

// MaxHorizon is the longest horizon the store named by spec can hold, and
// the kind of store it names (memory, disk, Redis), for messages.
func MaxHorizon(spec string) (time.Duration, string, error) {
	kind, _, err := parse(spec)
	if err != nil {
		return 0, "", err
	}
	return maxHorizon(kind), kind, nil
}

const (
	kindMem   = "memory"
	kindFile  = "disk"
	kindRedis = "Redis"
)

var errSpec = errors.New("want mem, file:PATH or redis://HOST")

func parse(spec string) (kind, arg string, err error) {
	switch {
	case spec == "" || spec == "mem":
		return kindMem, "", nil
	case strings.HasPrefix(spec, "file:"):
		path := strings.TrimPrefix(spec, "file:")
		if path == "" {
			return "", "", fmt.Errorf("state %q: empty path: want file:PATH", spec)
		}
		if strings.HasPrefix(path, "//") {
			// file:///x is a URL habit; say so instead of opening "//x".
			return "", "", fmt.Errorf("state %q: write file:PATH (file:/var/lib/x.db), not a file:// URL", spec)
		}
		return kindFile, path, nil
	case strings.HasPrefix(spec, "redis://") || strings.HasPrefix(spec, "rediss://"):
		return kindRedis, spec, nil
	}
	return "", "", fmt.Errorf("unknown state %q: %w", redact.URL(spec), errSpec)
}

func maxHorizon(kind string) time.Duration {
	switch kind {
	case kindFile:
		return disk.MaxHorizon
	case kindRedis:
		return redis.MaxHorizon
	}
	return mem.MaxHorizon
}

type nopCloser struct{}

func (nopCloser) Close() error { return nil }
