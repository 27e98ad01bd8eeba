package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/dedupflow/dedupflow/sink/stdout"
	"github.com/dedupflow/dedupflow/sink/topic"
)

// sinkSpec is what --sink and its companions say, checked.
type sinkSpec struct {
	kind       string // sinkPubSub, sinkStdout or sinkPostgres
	url        string // --sink, for the postgres sink
	table      string // --table, for the postgres sink
	onConflict postgres.OnConflict
}

// sinkWiring is what a sink is opened with.
type sinkWiring struct {
	client  *pubsub.Client
	topic   pubsubio.Name // --output-topic, for the pubsub sink
	timeout time.Duration // one write's bound
	stdout  io.Writer     // for --sink stdout; nil means os.Stdout
	log     *slog.Logger
}

// The kinds of sink --sink names.
const (
	sinkPubSub   = "pubsub"
	sinkStdout   = "stdout"
	sinkPostgres = "postgres"
)

// sinkKind tells which sink --sink names.
func sinkKind(spec string) (string, error) {
	switch {
	case spec == "pubsub" || spec == "":
		return sinkPubSub, nil
	case spec == "stdout":
		return sinkStdout, nil
	case strings.HasPrefix(spec, "postgres://") || strings.HasPrefix(spec, "postgresql://"):
		return sinkPostgres, nil
	}
	return "", fmt.Errorf("unknown --sink %q: want pubsub, stdout or a postgres:// URL", sinkLabel(spec))
}

// openSink opens the sink named by --sink. The returned func stops it,
// after the pipeline has finished its writes.
func openSink(ctx context.Context, s sinkSpec, w sinkWiring) (sink.Sink, func(), error) {
	switch s.kind {
	case sinkPubSub:
		ts := topic.New(w.client, w.topic, w.timeout)
		return ts, ts.Stop, nil
	case sinkStdout:
		out := w.stdout
		if out == nil {
			out = os.Stdout
		}
		return stdout.New(out), func() {}, nil
	default:
		o := postgres.Options{Table: s.table, OnConflict: s.onConflict, Logger: w.log}
		if w.timeout > 0 {
			// Half the write's bound: a statement that cannot finish
			// by then fails as unavailable while the writer still
			// waits, so the pipeline logs the cause, not a timeout.
			o.StatementTimeout = max(w.timeout/2, time.Second)
		}
		ps, err := postgres.Open(ctx, s.url, o)
		if err != nil {
			return nil, nil, fmt.Errorf("--sink postgres: %w", err)
		}
		return ps, ps.Close, nil
	}
}

// sinkLabel is --sink as logs may show it: a database URL without its
// password.
func sinkLabel(spec string) string { return redact.URL(spec) }
