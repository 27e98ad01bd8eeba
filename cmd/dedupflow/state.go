package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// openState opens the store named by --state and checks that it can hold
// the horizon.
func openState(_ context.Context, spec string, horizon time.Duration, _ *slog.Logger) (dedup.Store, func(), error) {
	switch spec {
	case "mem", "":
		if horizon > mem.MaxHorizon {
			return nil, nil, fmt.Errorf("--horizon %v is longer than the memory store holds (%v)", horizon, mem.MaxHorizon)
		}
		return mem.New(), func() {}, nil
	}
	return nil, nil, fmt.Errorf("unknown --state %q: want mem", spec)
}
