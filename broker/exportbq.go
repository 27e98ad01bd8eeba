package broker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/hamba/avro/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/bigquery"
)

// BigQuery subscriptions append each message as a row through the Storage
// Write API's _default stream (package internal/bigquery), as the service
// does, after checking the table over REST: the emulator answers an append
// to a missing table with a bare Unknown.

// bqBatch bounds the rows of one append: the messages leased at once.
const bqBatch = 500

// parseTableName reads bigquery_config.table, "project.dataset.table" (or
// "project:dataset.table").
func parseTableName(s string) (project string, ref bigquery.TableRef, err error) {
	p, rest, ok := strings.Cut(strings.Replace(s, ":", ".", 1), ".")
	ds, tb, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 || p == "" || ds == "" || tb == "" || strings.Contains(tb, ".") {
		return "", ref, fmt.Errorf("table %q: want {projectId}.{datasetId}.{tableId}", s)
	}
	return p, bigquery.TableRef{Dataset: ds, Table: tb}, nil
}

func checkBigQueryConfig(c *pb.BigQueryConfig) error {
	if _, _, err := parseTableName(c.Table); err != nil {
		return status.Errorf(codes.InvalidArgument, "bigquery_config: %v", err)
	}
	if c.UseTopicSchema && c.UseTableSchema {
		return status.Error(codes.InvalidArgument, "bigquery_config: use_topic_schema and use_table_schema cannot both be set")
	}
	c.State = pb.BigQueryConfig_ACTIVE // until the exporter finds otherwise
	return nil
}

type bqDest struct {
	b      *Broker
	client *bigquery.Client
	sub    string
	ref    bigquery.TableRef
	c      *pb.BigQueryConfig
	topic  avro.Schema // use_topic_schema on a topic with a binary Avro schema: decode with it
	table  *bigquery.Table
	w      *bigquery.Writer
}

// bqClient is the broker's client of BigQuery in project, made on first use.
func (b *Broker) bqClient(project string) (*bigquery.Client, error) {
	b.bqMu.Lock()
	defer b.bqMu.Unlock()
	if c := b.bqClients[project]; c != nil {
		return c, nil
	}
	c, err := bigquery.Open(context.Background(), project, b.opts.Exports.BigQuery)
	if err != nil {
		return nil, err
	}
	if b.bqClients == nil {
		b.bqClients = map[string]*bigquery.Client{}
	}
	b.bqClients[project] = c
	return c, nil
}

func (b *Broker) newBigQueryDest(sub string, c *pb.BigQueryConfig) (exportDest, error) {
	if !b.opts.Exports.BigQuery.Emulated() {
		return nil, &destError{state: exportNotFound, err: fmt.Errorf(
			"no BigQuery endpoint: start the broker with %s and %s set to a BigQuery emulator's REST and gRPC ports", bigquery.EnvREST, bigquery.EnvStorage)}
	}
	project, ref, err := parseTableName(c.Table)
	if err != nil {
		return nil, err
	}
	client, err := b.bqClient(project)
	if err != nil {
		return nil, &destError{state: exportNotFound, err: fmt.Errorf("bigquery: %w", err)}
	}
	d := &bqDest{b: b, client: client, sub: sub, ref: ref, c: c}
	if c.UseTopicSchema {
		sch, enc, err := b.topicAvroSchema(sub)
		if err != nil {
			return nil, err
		}
		if sch == nil {
			return nil, &destError{state: exportSchemaMismatch, err: errors.New("use_topic_schema: the topic has no schema")}
		}
		if enc == pb.Encoding_BINARY {
			d.topic = sch
		}
	}
	return d, nil
}

func (d *bqDest) limits() (int, int, time.Duration) { return bqBatch, bigquery.MaxRequestBytes, 0 }

func (d *bqDest) close() {
	if d.w != nil {
		d.w.Close()
		d.w = nil
	}
}

// check reads the table and that it has the columns the config writes;
// then the destination holds a writer on its stream.
func (d *bqDest) check(ctx context.Context) error {
	t, err := d.client.Table(ctx, d.ref)
	if errors.Is(err, bigquery.ErrNotFound) {
		return &destError{state: exportNotFound, err: err}
	}
	if err != nil {
		return &destError{state: exportNotFound, err: fmt.Errorf("bigquery: %w", err)}
	}
	var need []string
	if d.c.WriteMetadata {
		need = append(need, "subscription_name", "message_id", "publish_time", "attributes")
	}
	if !d.c.UseTableSchema && !d.c.UseTopicSchema {
		need = append(need, "data")
	}
	for _, col := range need {
		if t.Column(col) == nil {
			return &destError{state: exportSchemaMismatch, err: fmt.Errorf("table %s has no column %s", d.ref, col)}
		}
	}
	d.close()
	w, err := d.client.NewWriter(ctx, t, 0, d.b.log)
	if err != nil {
		return &destError{state: exportNotFound, err: fmt.Errorf("bigquery: open the table's stream: %w", err)}
	}
	d.table, d.w = t, w
	return nil
}

func (d *bqDest) write(ctx context.Context, batch []delivery) ([]error, error) {
	errs := make([]error, len(batch))
	rows := make([][]byte, 0, len(batch))
	idx := make([]int, 0, len(batch))
	opts := bigquery.Options{UseTableSchema: d.c.UseTableSchema || d.c.UseTopicSchema, DropUnknownFields: d.c.DropUnknownFields}
	for i, dl := range batch {
		row, err := d.row(dl.m, opts)
		if err != nil {
			errs[i] = &rowError{err}
			continue
		}
		rows = append(rows, row)
		idx = append(idx, i)
	}
	if len(rows) == 0 {
		return errs, nil
	}
	out := d.w.Append(ctx, rows)
	written := 0
	for j, err := range out {
		switch {
		case err == nil:
			written++
		case errors.Is(err, bigquery.ErrUnfit):
			errs[idx[j]] = &rowError{err}
		default:
			errs[idx[j]] = err
		}
	}
	if written == 0 && len(out) > 0 && !errors.Is(out[0], bigquery.ErrUnfit) {
		// Nothing went in: the table may be gone. Checking again says.
		if cerr := d.check(ctx); cerr != nil {
			return nil, cerr
		}
		return nil, out[0]
	}
	return errs, nil
}

// row makes a message one row of the table, as the config says.
func (d *bqDest) row(m *message, opts bigquery.Options) ([]byte, error) {
	r := bigquery.Row{Data: m.data()}
	if d.topic != nil {
		var v any
		if err := avro.Unmarshal(d.topic, m.data(), &v); err != nil {
			return nil, fmt.Errorf("the message is not a record of the topic's schema: %w", err)
		}
		data, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("the topic schema's record as JSON: %w", err)
		}
		r.Data = data
	}
	if d.c.WriteMetadata {
		r.Meta = bigquery.Metadata(d.sub, m.id(), time.Unix(0, m.publish).UTC(), m.attrs())
	}
	if !opts.UseTableSchema {
		r.Meta = append(r.Meta, bigquery.Value{Column: "data", V: m.data()})
	}
	return d.table.Encode(r, opts)
}
