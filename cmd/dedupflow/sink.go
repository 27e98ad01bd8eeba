package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"

	bqenv "github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/bigquery"
	"github.com/dedupflow/dedupflow/sink/bigtable"
	"github.com/dedupflow/dedupflow/sink/columns"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/dedupflow/dedupflow/sink/spanner"
	"github.com/dedupflow/dedupflow/sink/stdout"
	"github.com/dedupflow/dedupflow/sink/topic"
)

// sinkSpec is what --sink and its companions say, checked.
type sinkSpec struct {
	kind       string // sinkPubSub, sinkStdout or sinkPostgres
	url        string // --sink, for the postgres sink
	table      string // --table, for the postgres sink
	onConflict postgres.OnConflict
	metadata   columns.Metadata // for the table sinks
	fields     []string         // JSON fields written as columns, for the table sinks
	family     string           // for the bigtable sink
	rowKey     bigtable.RowKey  // for the bigtable sink
}

// sinkWiring is what a sink is opened with.
type sinkWiring struct {
	client  *pubsub.Client
	topic   pubsubio.Name // --output-topic, for the pubsub sink
	timeout time.Duration // one write's bound
	stdout  io.Writer     // for --sink stdout; nil means os.Stdout
	sub     string        // the input subscription's full name, for the subscription_name column
	log     *slog.Logger
}

// The kinds of sink --sink names.
const (
	sinkPubSub   = "pubsub"
	sinkStdout   = "stdout"
	sinkPostgres = "postgres"
	sinkSpanner  = "spanner"
	sinkBigtable = "bigtable"
	sinkBigQuery = "bigquery"
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
	case strings.HasPrefix(spec, "spanner://"):
		_, err := spanner.ParseURL(spec)
		return sinkSpanner, err
	case strings.HasPrefix(spec, "bigtable://"):
		_, _, err := bigtable.ParseURL(spec)
		return sinkBigtable, err
	case strings.HasPrefix(spec, "bigquery://"):
		_, _, err := bigquery.ParseURL(spec)
		return sinkBigQuery, err
	}
	return "", fmt.Errorf("unknown --sink %q: want pubsub, stdout, a postgres:// URL, spanner://projects/P/instances/I/databases/D, bigtable://projects/P/instances/I or bigquery://PROJECT/DATASET", sinkLabel(spec))
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
	case sinkSpanner:
		ss, err := spanner.Open(ctx, s.url, spanner.Options{Table: s.table, Metadata: s.metadata, Fields: s.fields, Subscription: w.sub, Logger: w.log})
		if err != nil {
			return nil, nil, fmt.Errorf("--sink spanner: %w", err)
		}
		return ss, ss.Close, nil
	case sinkBigtable:
		bs, err := bigtable.Open(ctx, s.url, bigtable.Options{Table: s.table, Family: s.family, RowKey: s.rowKey,
			Metadata: s.metadata, Fields: s.fields, Subscription: w.sub, Logger: w.log})
		if err != nil {
			return nil, nil, fmt.Errorf("--sink bigtable: %w", err)
		}
		return bs, bs.Close, nil
	case sinkBigQuery:
		bs, err := bigquery.Open(ctx, s.url, bigquery.Options{Table: s.table, Metadata: s.metadata, Fields: s.fields,
			Subscription: w.sub, Endpoints: bqenv.EndpointsFromEnv(), Logger: w.log})
		if err != nil {
			return nil, nil, fmt.Errorf("--sink bigquery: %w", err)
		}
		return bs, bs.Close, nil
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

// tableSink reports whether kind writes rows of columns, and so reads
// --metadata-columns and --fields.
func tableSink(kind string) bool {
	return kind == sinkSpanner || kind == sinkBigtable || kind == sinkBigQuery
}

func (s *sinkFlags) registerColumns(fs *flag.FlagSet) {
	fs.StringVar(&s.metadata, "metadata-columns", "all", "table sinks: metadata columns written, all, none or a list of key (named as --output-id-attribute), message_id, publish_time, attributes, data, subscription_name; KIND=COLUMN renames one")
	fs.StringVar(&s.fields, "fields", "", "table sinks: fields of a JSON payload written to columns of the same names, comma-separated (spanner: default the table's other columns)")
	fs.StringVar(&s.family, "column-family", bigtable.DefaultFamily, "bigtable sink: the column family written (a rewrite clears it first)")
	fs.StringVar(&s.rowKey, "row-key", "{key}", "bigtable sink: row key template of {key}, {message_id}, {attributes.NAME} and {data.NAME} (a JSON field)")
}

// checkColumns checks --metadata-columns and --fields into s, and for a
// table sink the flags it shares with postgres.
func (j *jobFlags) checkColumns(s *sinkSpec) error {
	for _, f := range []string{"column-family", "row-key"} {
		if j.given[f] && s.kind != sinkBigtable {
			return fmt.Errorf("--%s applies to --sink bigtable only, not --sink %s", f, sinkLabel(s.url))
		}
	}
	if !tableSink(s.kind) {
		for _, f := range []string{"metadata-columns", "fields"} {
			if j.given[f] {
				return fmt.Errorf("--%s applies to table sinks only, not --sink %s", f, sinkLabel(s.url))
			}
		}
		return nil
	}
	switch {
	case j.given["on-conflict"]:
		how := "it writes each key once, last write winning"
		if s.kind == sinkBigQuery {
			how = "it appends each key once, the first write kept"
		}
		return fmt.Errorf("--on-conflict applies to --sink postgres only, not --sink %s (%s)", s.kind, how)
	case s.table == "":
		return fmt.Errorf("--sink %s needs --table", s.kind)
	case s.kind == sinkBigQuery && strings.Contains(s.table, "."):
		return dottedBigQueryTable(s.url, s.table)
	}
	key := cmp.Or(j.key.outIDAttr, j.key.idAttr, pipeline.DefaultOutputIDAttribute)
	var err error
	if s.metadata, err = columns.Parse(j.sink.metadata, key); err != nil {
		return fmt.Errorf("--metadata-columns: %w", err)
	}
	for f := range strings.SplitSeq(j.sink.fields, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		if s.metadata.Has(f) {
			return fmt.Errorf("--fields: %q is also a metadata column (see --metadata-columns)", f)
		}
		s.fields = append(s.fields, f)
	}
	s.family = j.sink.family
	if s.rowKey, err = bigtable.ParseRowKey(j.sink.rowKey); err != nil {
		return fmt.Errorf("--row-key: %w", err)
	}
	return nil
}

// dottedBigQueryTable refuses a --table that names its project and dataset
// too (up's --bigquery-table form): the sink would look for the table
// PROJECT.DATASET.PROJECT.DATASET.TABLE. BigQuery table IDs hold no dots,
// so no table is refused that could exist.
func dottedBigQueryTable(sinkURL, table string) error {
	project, dataset, _ := bigquery.ParseURL(sinkURL) // checked by sinkKind
	parts := strings.Split(table, ".")
	switch len(parts) {
	case 3:
		project, dataset = parts[0], parts[1]
	case 2:
		dataset = parts[0]
	}
	return fmt.Errorf("--table %s: --table takes a table ID, not PROJECT.DATASET.TABLE (the project and dataset are --sink's): give --sink bigquery://%s/%s --table %s",
		table, project, dataset, parts[len(parts)-1])
}
