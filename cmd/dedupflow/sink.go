package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// sinkSpec is what --sink and its companions say.
type sinkSpec struct {
	spec    string // --sink
	table   string // --table
	client  *pubsub.Client
	topic   pubsubio.Name // --output-topic, for the pubsub sink
	timeout time.Duration // one write's bound
	log     *slog.Logger
}

// openSink opens the sink named by --sink.
func openSink(_ context.Context, s sinkSpec) (pipeline.Sink, func(), error) {
	switch s.spec {
	case "pubsub", "":
		ts := pubsubio.NewTopicSink(s.client, s.topic, s.timeout)
		return ts, ts.Stop, nil
	}
	return nil, nil, fmt.Errorf("unknown --sink %q: want pubsub", s.spec)
}
