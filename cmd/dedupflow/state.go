package main

import (
	"context"
	"fmt"
	"log/slog"
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

// openState opens the store of --state for the dedup options o.
func openState(ctx context.Context, s stateSpec, o dedup.Options, log *slog.Logger) (dedup.Store, func(), error) {
	st, c, err := store.Open(ctx, s.spec, store.Options{Logger: log, Horizon: o.Horizon, EventTime: o.Domain == dedup.EventTime})
	if err != nil {
		return nil, nil, err
	}
	return st, func() {
		if err := c.Close(); err != nil {
			log.Warn("closing the dedup store", "err", err)
		}
	}, nil
}
