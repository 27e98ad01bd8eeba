package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store"
)

// stateSpec is a checked --state.
type stateSpec struct {
	spec  string
	path  string // file:PATH: the disk store's folder
	redis bool   // a redis:// or rediss:// URL: the audit can live there too
}

// parseState checks the form of --state and that its store can hold the
// horizon, before anything connects: a typo should not first show up as a
// Pub/Sub credentials error.
func parseState(spec string, horizon time.Duration) (stateSpec, error) {
	maxH, kind, err := store.MaxHorizon(spec)
	if err != nil {
		return stateSpec{}, fmt.Errorf("--state: %w", err)
	}
	if horizon > maxH {
		return stateSpec{}, fmt.Errorf("--horizon %v is longer than the %s store holds (%v)", horizon, kind, maxH)
	}
	s := stateSpec{spec: spec, redis: strings.HasPrefix(spec, "redis://") || strings.HasPrefix(spec, "rediss://")}
	if path, ok := strings.CutPrefix(spec, "file:"); ok {
		s.path = path
	}
	return s, nil
}

// openState opens the store of --state for the dedup policy o. Its close
// takes whether the start failed: a disk store folder this start created
// and that holds no key is then removed, so a failed start (a metrics port
// in use) leaves no empty store behind.
func openState(ctx context.Context, s stateSpec, o dedup.Policy, log *slog.Logger) (dedup.Store, func(failed bool), error) {
	created := false
	if s.path != "" {
		_, err := os.Stat(s.path)
		created = errors.Is(err, fs.ErrNotExist)
	}
	st, c, err := store.Open(ctx, s.spec, store.Options{Logger: log, Horizon: o.Horizon, EventTime: o.TimeDomain == dedup.EventTime})
	if err != nil {
		if created {
			_ = os.RemoveAll(s.path) // what Open made before it failed
		}
		return nil, nil, err
	}
	return st, func(failed bool) {
		l, counts := st.(interface{ Len() int })
		empty := counts && l.Len() == 0
		if err := c.Close(); err != nil {
			log.Warn("closing the dedup store", "err", err)
		}
		if failed && created && empty {
			if err := os.RemoveAll(s.path); err != nil {
				log.Warn("removing the empty store folder of a failed start", "path", s.path, "err", err)
			}
		}
	}, nil
}
