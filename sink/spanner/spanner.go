// Package spanner is the idempotent Cloud Spanner sink: one row per key,
// written with InsertOrUpdate mutations keyed on the table's primary key
// (the dedup key's column, or fields of the message the user made the
// key), so writing a message again, after a crash or a replay, changes
// nothing. Columns come from the JSON payload's fields by name and from
// the metadata columns of package columns.
//
// The table must exist: Open reads its schema from INFORMATION_SCHEMA and
// refuses, in one line, a table or column that is missing or cannot hold
// what the sink writes.
package spanner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"cloud.google.com/go/spanner"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
	"github.com/dedupflow/dedupflow/sink/internal/writes"
)

// Limits of one commit.
const (
	// MaxMutations is Spanner's limit of mutations per commit: each
	// column of each row written counts as one.
	MaxMutations = 80_000
	// DefaultMaxBytes keeps a commit well under Spanner's 100 MB.
	DefaultMaxBytes = 64 << 20
	// openTimeout bounds the schema check at Open, so an unreachable
	// service is one error at start rather than a hang.
	openTimeout = 30 * time.Second
	// DefaultBatchTimeout is Options.BatchTimeout's default.
	DefaultBatchTimeout = writes.DefaultTimeout
)

// Options configure a Sink.
type Options struct {
	Table    string           // required; it must exist
	Metadata columns.Metadata // the metadata columns written
	// Fields are the payload's JSON fields written to the columns of the
	// same names; empty: every column of the table that is not a metadata
	// column (nor generated).
	Fields []string
	// Subscription is the input subscription's full name, for the
	// subscription_name column.
	Subscription string
	// MaxMutations caps the mutations of one commit (at most, and by
	// default, MaxMutations); MaxBytes caps its approximate size.
	MaxMutations, MaxBytes int
	// BatchTimeout bounds a batch of gathered Writes, for writers that
	// set no deadline (DefaultBatchTimeout when zero); a batch ends at its
	// writers' latest deadline when that comes sooner.
	BatchTimeout time.Duration
	Logger       *slog.Logger
}

func (o *Options) defaults() {
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
	Commits int64 // commits that succeeded
	Rows    int64 // rows in them
	Failed  int64 // commits that failed
}

// Sink writes messages to a Spanner table.
type Sink struct {
	client     *spanner.Client
	opt        Options
	cols       []column
	names      []string // of cols, as mutations name them
	fieldNames []string // of the field columns, in order

	gather *writes.Gatherer[*sink.Message]
	guard  writes.Guard

	commits, rows, failed atomic.Int64
}

var _ sink.BatchSink = (*Sink)(nil)

// ParseURL turns spanner://projects/P/instances/I/databases/D into the
// database's name.
func ParseURL(u string) (string, error) {
	db, ok := strings.CutPrefix(u, "spanner://")
	p := strings.Split(db, "/")
	if !ok || len(p) != 6 || p[0] != "projects" || p[2] != "instances" || p[4] != "databases" || p[1] == "" || p[3] == "" || p[5] == "" {
		return "", fmt.Errorf("spanner sink %q: want spanner://projects/P/instances/I/databases/D", u)
	}
	return db, nil
}

// Open connects to the database of url (spanner://projects/P/instances/I/databases/D;
// the client takes the Spanner emulator from SPANNER_EMULATOR_HOST),
// checks the table against what it will write, and returns the sink.
func Open(ctx context.Context, url string, o Options) (*Sink, error) {
	o.defaults()
	db, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if o.Table == "" {
		return nil, errors.New("spanner sink: no table given")
	}
	client, err := spanner.NewClient(ctx, db)
	if err != nil {
		return nil, fmt.Errorf("spanner sink: %w: credentials: %w", ErrRefused, err)
	}
	cctx, cancel := context.WithTimeout(ctx, openTimeout)
	defer cancel()
	cols, err := plan(cctx, client, o.Table, o.Metadata, o.Fields)
	if err != nil {
		client.Close()
		if cctx.Err() != nil && ctx.Err() == nil {
			return nil, fmt.Errorf("spanner sink: no answer from database %s within %v: %w", db, openTimeout, err)
		}
		return nil, fmt.Errorf("spanner sink: database %s: %w", db, err)
	}
	s := &Sink{client: client, opt: o, cols: cols}
	for _, c := range cols {
		s.names = append(s.names, c.name)
		if !c.meta {
			s.fieldNames = append(s.fieldNames, c.name)
		}
	}
	s.gather = writes.NewGatherer(ctx, writes.Gathering{Max: writes.DefaultMax, Flushers: writes.DefaultFlushers,
		Timeout: o.BatchTimeout, Closed: ErrClosed}, s.WriteBatch)
	o.Logger.Info("spanner sink ready", "database", db, "table", o.Table, "columns", strings.Join(s.names, ","))
	return s, nil
}

// Write writes one message, gathered with the Writes that arrive with it
// into one batch (see WriteBatch); it returns once its row is committed.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	err := s.gather.Write(ctx, m)
	if err != nil && err == context.Cause(ctx) {
		return fmt.Errorf("write message %s to %s: %w", m.ID, s.opt.Table, err)
	}
	return err
}

// WriteBatch writes ms in as few commits as Spanner's limits allow,
// setting errs[i] for each message: nil once its row is committed, an
// error wrapping sink.ErrPermanent (naming the column) for a message the
// table cannot hold, else the commit's error.
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	// Each column of a row counts as a mutation: a commit holds so many rows.
	lim := writes.Limits{Ops: max(1, s.opt.MaxMutations/len(s.cols)), Bytes: s.opt.MaxBytes}
	s.guard.Do(errs, ErrClosed, func() {
		writes.Split(ms, errs, lim, s.upsert, func(muts []*spanner.Mutation, idx []int) { s.commit(ctx, muts, idx, errs) })
	})
}

// upsert is m's row as a mutation, one row of a commit, and its size.
func (s *Sink) upsert(m *sink.Message) (mut *spanner.Mutation, rows, size int, err error) {
	r, err := s.encode(m)
	if err != nil {
		return nil, 0, 0, err
	}
	return spanner.InsertOrUpdate(s.opt.Table, s.names, r.vals), 1, r.size, nil
}

// commit applies muts, the rows of ms[idx[j]], and sets their errors. A
// commit the server refuses for the data of some row is split until the
// row is found: it alone goes to the dead-letter topic.
//
// Apply is at-least-once (no transaction of our own): InsertOrUpdate is
// idempotent, so a commit applied twice is one row each, and concurrent
// transactional Applies fail with "Invalid transaction ID" on the
// emulator, which the client does not retry.
func (s *Sink) commit(ctx context.Context, muts []*spanner.Mutation, idx []int, errs []error) {
	_, err := s.client.Apply(ctx, muts, spanner.ApplyAtLeastOnce())
	switch {
	case err == nil:
		s.commits.Add(1)
		s.rows.Add(int64(len(muts)))
		return
	case rowError(err) && len(muts) > 1:
		h := len(muts) / 2
		s.commit(ctx, muts[:h], idx[:h], errs)
		s.commit(ctx, muts[h:], idx[h:], errs)
		return
	case rowError(err):
		err = fmt.Errorf("%w: %w", errInvalid, err)
	default:
		err = classify(err)
	}
	s.failed.Add(1)
	for _, i := range idx {
		errs[i] = err
	}
}

// Stats returns the sink's counters.
func (s *Sink) Stats() Stats {
	return Stats{Commits: s.commits.Load(), Rows: s.rows.Load(), Failed: s.failed.Load()}
}

// Close finishes the gathered batches, waits for the writes under way and
// closes the client.
func (s *Sink) Close() {
	s.gather.Close()
	s.guard.Close(s.client.Close)
}
