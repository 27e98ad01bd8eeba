package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store"
)

// openState opens the store named by --state and checks that it can hold
// the horizon.
func openState(ctx context.Context, spec string, horizon time.Duration, eventTime bool, log *slog.Logger) (dedup.Store, func(), error) {
	s, c, err := store.Open(ctx, spec, store.Options{Logger: log, Horizon: horizon, EventTime: eventTime})
	if err != nil {
		return nil, nil, err
	}
	return s, func() {
		if err := c.Close(); err != nil {
			log.Warn("closing the dedup store", "err", err)
		}
	}, nil
}
