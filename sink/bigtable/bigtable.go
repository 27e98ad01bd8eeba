// Package bigtable is the idempotent Cloud Bigtable sink: one row per key
// (the dedup key, or a template over the message), whose cells are
// written at an explicit timestamp, the message's event time, never the
// server's. A row's mutation first clears the sink's column family, then
// sets the cells, and Bigtable applies a row's mutations atomically: so a
// message written again, or another copy of its key, leaves one cell per
// column, and the client may retry the mutation (it does not retry one at
// the server's time).
//
// The table and its column family must exist: Open checks them through
// the admin API and refuses, in one line, what is missing.
package bigtable

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"cloud.google.com/go/bigtable"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
	"github.com/dedupflow/dedupflow/sink/internal/writes"
)

// Limits of one MutateRows request.
const (
	// MaxMutations is Bigtable's limit of mutations per MutateRows
	// request, over all its entries.
	MaxMutations = 100_000
	// DefaultMaxBytes keeps a request well under what the service takes.
	DefaultMaxBytes = 64 << 20
	// DefaultFamily is the column family written by default.
	DefaultFamily = "cf"
	openTimeout   = 30 * time.Second
	// DefaultBatchTimeout is Options.BatchTimeout's default.
	DefaultBatchTimeout = writes.DefaultTimeout
)

// Options configure a Sink.
type Options struct {
	Table    string // required; it must exist
	Family   string // the column family written; DefaultFamily when empty
	RowKey   RowKey // the zero value is {key}
	Metadata columns.Metadata
	// Fields are the payload's JSON fields written as cells of the same
	// names (a string's text, other values as JSON).
	Fields []string
	// Subscription is the input subscription's full name, for the
	// subscription_name column.
	Subscription string
	// MaxMutations caps the mutations of one request (at most, and by
	// default, MaxMutations); MaxBytes caps its approximate size.
	MaxMutations, MaxBytes int
	// BatchTimeout bounds a batch of gathered Writes, for writers that
	// set no deadline (DefaultBatchTimeout when zero); a batch ends at its
	// writers' latest deadline when that comes sooner.
	BatchTimeout time.Duration
	Logger       *slog.Logger
}

func (o *Options) defaults() {
	if o.Family == "" {
		o.Family = DefaultFamily
	}
	if o.RowKey.parts == nil {
		o.RowKey, _ = ParseRowKey("")
	}
	if o.MaxMutations <= 0 || o.MaxMutations > MaxMutations {
		o.MaxMutations = MaxMutations
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = DefaultMaxBytes
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = DefaultBatchTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are counters of a Sink.
type Stats struct {
	Requests int64 // MutateRows calls that went through (some rows may have failed)
	Rows     int64 // rows written
	Failed   int64 // rows that failed
}

// Sink writes messages to a Bigtable table.
type Sink struct {
	client *bigtable.Client
	table  *bigtable.Table
	opt    Options
	names  []string // the JSON fields read: the cells', then the row key's

	gather *writes.Gatherer[*sink.Message]
	guard  writes.Guard

	requests, rows, failed atomic.Int64
}

var _ sink.BatchSink = (*Sink)(nil)

// ParseURL turns bigtable://projects/P/instances/I into P and I.
func ParseURL(u string) (project, instance string, err error) {
	rest, ok := strings.CutPrefix(u, "bigtable://")
	p := strings.Split(rest, "/")
	if !ok || len(p) != 4 || p[0] != "projects" || p[2] != "instances" || p[1] == "" || p[3] == "" {
		return "", "", fmt.Errorf("bigtable sink %q: want bigtable://projects/P/instances/I", u)
	}
	return p[1], p[3], nil
}

// Open connects to the instance of url (bigtable://projects/P/instances/I;
// the clients take the Bigtable emulator from BIGTABLE_EMULATOR_HOST),
// checks that the table has the column family, and returns the sink.
func Open(ctx context.Context, url string, o Options) (*Sink, error) {
	o.defaults()
	project, instance, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	switch {
	case o.Table == "":
		return nil, errors.New("bigtable sink: no table given")
	case len(o.Metadata.Columns()) == 0 && len(o.Fields) == 0:
		return nil, errors.New("bigtable sink: no cells to write: name metadata columns or fields")
	}
	where := "instance projects/" + project + "/instances/" + instance
	cctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	if err := checkTable(cctx, project, instance, o.Table, o.Family); err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("bigtable sink: no answer from %s within %v: %w", where, openTimeout, err)
		}
		return nil, fmt.Errorf("bigtable sink: %s: %w", where, err)
	}
	client, err := bigtable.NewClient(ctx, project, instance)
	if err != nil {
		return nil, fmt.Errorf("bigtable sink: %w: credentials: %w", ErrRefused, err)
	}
	s := &Sink{client: client, table: client.Open(o.Table), opt: o}
	s.names = append(append(s.names, o.Fields...), o.RowKey.fields...)
	s.gather = writes.NewGatherer(ctx, writes.Gathering{Max: writes.DefaultMax, Flushers: writes.DefaultFlushers,
		Timeout: o.BatchTimeout, Closed: ErrClosed}, s.WriteBatch)
	o.Logger.Info("bigtable sink ready", "instance", where, "table", o.Table, "family", o.Family)
	return s, nil
}

// checkTable checks through the admin API that the table exists with
// the family.
func checkTable(ctx context.Context, project, instance, table, family string) error {
	ac, err := bigtable.NewAdminClient(ctx, project, instance)
	if err != nil {
		return fmt.Errorf("%w: credentials: %w", ErrRefused, err)
	}
	defer ac.Close()
	ti, err := ac.TableInfo(ctx, table)
	switch {
	case status.Code(err) == codes.NotFound:
		return fmt.Errorf("%w: table %s does not exist (create it with the column family %s; see docs/sink-bigtable.md)", ErrRefused, table, family)
	case err != nil:
		return fmt.Errorf("reading table %s: %w", table, classify(err))
	}
	for _, f := range ti.FamilyInfos {
		if f.Name == family {
			return nil
		}
	}
	return fmt.Errorf("%w: table %s has no column family %s (create it, or name another with --column-family)", ErrRefused, table, family)
}

// entry is one message's row.
type entry struct {
	key string
	mut *bigtable.Mutation
}

// encode turns m into its row: clear the family, then set each cell at
// m's event time. ops counts its mutations as the request limit counts
// them; size is its approximate size.
func (s *Sink) encode(m *sink.Message) (e entry, ops, size int, err error) {
	meta, err := s.opt.Metadata.Values(m, s.opt.Subscription)
	if err != nil {
		return entry{}, 0, 0, err
	}
	fields, err := columns.Fields(m.Data, s.names)
	if err != nil {
		return entry{}, 0, 0, err
	}
	e = entry{mut: bigtable.NewMutation()}
	ops = 1
	if e.key, err = s.opt.RowKey.key(m, fields[min(len(fields), len(s.opt.Fields)):]); err != nil {
		return entry{}, 0, 0, err
	}
	ts := cellTime(m)
	fam := s.opt.Family
	e.mut.DeleteCellsInFamily(fam)
	set := func(col string, v []byte) {
		e.mut.Set(fam, col, ts, v)
		ops++
		size += len(col) + len(v) + 16
	}
	for _, v := range meta {
		set(v.Name, metaBytes(v.V))
	}
	for i, f := range s.opt.Fields {
		if v := cellValue(fields[i]); v != nil {
			set(f, v)
		}
	}
	size += len(e.key)
	return e, ops, size, nil
}

// cellTime is m's event time (its publish time unless a timestamp
// attribute says otherwise) in milliseconds, the finest Bigtable takes:
// the same for every delivery of the message.
func cellTime(m *sink.Message) bigtable.Timestamp {
	t := m.EventTime
	if t.IsZero() {
		t = m.PublishTime
	}
	return bigtable.Time(t).TruncateToMilliseconds()
}

// metaBytes is a metadata value as a cell holds it; a time as RFC 3339.
func metaBytes(v any) []byte {
	switch v := v.(type) {
	case string:
		return []byte(v)
	case time.Time:
		return []byte(v.UTC().Format(time.RFC3339Nano))
	case []byte:
		return v
	case json.RawMessage:
		return v
	}
	panic(fmt.Sprintf("bigtable sink: metadata value of type %T", v))
}

// Write writes one message, gathered with the Writes that arrive with it
// into one batch (see WriteBatch); it returns once its row is written.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	err := s.gather.Write(ctx, m)
	if err != nil && err == context.Cause(ctx) {
		return fmt.Errorf("write message %s to %s: %w", m.ID, s.opt.Table, err)
	}
	return err
}

// WriteBatch writes ms in as few MutateRows requests as Bigtable's limits
// allow, setting errs[i]: nil once ms[i]'s row is written, an error
// wrapping sink.ErrPermanent for a message that cannot be a row, else the
// service's error.
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	lim := writes.Limits{Ops: s.opt.MaxMutations, Bytes: s.opt.MaxBytes}
	s.guard.Do(errs, ErrClosed, func() {
		writes.Split(ms, errs, lim, s.encode, func(batch []entry, idx []int) { s.apply(ctx, batch, idx, errs) })
	})
}

// apply sends one MutateRows request and sets each row's error.
func (s *Sink) apply(ctx context.Context, batch []entry, idx []int, errs []error) {
	keys := make([]string, len(batch))
	muts := make([]*bigtable.Mutation, len(batch))
	for j, e := range batch {
		keys[j], muts[j] = e.key, e.mut
	}
	rowErrs, err := s.table.ApplyBulk(ctx, keys, muts)
	if err != nil {
		err = classify(err)
		s.failed.Add(int64(len(batch)))
		for _, i := range idx {
			errs[i] = err
		}
		return
	}
	s.requests.Add(1)
	ok := int64(len(batch))
	for j, rerr := range rowErrs {
		switch {
		case rerr == nil:
			continue
		case rowError(rerr):
			rerr = fmt.Errorf("%w: %w", errInvalid, rerr)
		default:
			rerr = classify(rerr)
		}
		errs[idx[j]] = rerr
		ok--
	}
	s.rows.Add(ok)
	s.failed.Add(int64(len(batch)) - ok)
}

// Stats returns the sink's counters.
func (s *Sink) Stats() Stats {
	return Stats{Requests: s.requests.Load(), Rows: s.rows.Load(), Failed: s.failed.Load()}
}

// Close finishes the gathered batches, waits for the writes under way and
// closes the client.
func (s *Sink) Close() {
	s.gather.Close()
	s.guard.Close(func() { _ = s.client.Close() })
}
