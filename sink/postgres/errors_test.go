package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink/postgres"
)

// A server that cannot be reached is reported as the sink's outage, not the
// dedup store's, and is still transient: the pipeline backs off and retries.
func TestOpenUnreachableNamesTheSink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens, the dial is refused at once.
	_, err := postgres.Open(ctx, "postgres://nobody@127.0.0.1:1/db?sslmode=disable&connect_timeout=5", postgres.Options{})
	if err == nil {
		t.Fatal("open with nothing listening: no error")
	}
	if msg := err.Error(); strings.Contains(msg, "dedup store") || !strings.Contains(msg, "postgres sink unavailable") {
		t.Errorf("error %q: want it to say the postgres sink is unavailable, not the dedup store", msg)
	}
	if !errors.Is(err, postgres.ErrUnavailable) || !errors.Is(err, dedup.ErrUnavailable) || !dedup.Transient(err) {
		t.Errorf("error %v: want postgres.ErrUnavailable, matching dedup.ErrUnavailable, transient", err)
	}
}
