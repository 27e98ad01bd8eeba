// Package postgres is the idempotent PostgreSQL sink: one row per dedup key,
// written with INSERT … ON CONFLICT (key), so a replay after a crash or a
// cutover is a no-op. It is the durable half of the pipeline's guarantee:
// the dedup store keeps most copies away, the primary key keeps the rest out.
//
// Writes from the pipeline's many goroutines are coalesced by a batcher into
// one INSERT … SELECT FROM unnest(…) statement per batch (up to MaxBatch
// rows), run by a few flushers in parallel; each Write returns once the
// statement holding its row has committed.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/internal/writes"
)

// OnConflict says what a row with an existing key does.
type OnConflict int

const (
	// DoNothing keeps the first row written for a key: copies are no-ops.
	DoNothing OnConflict = iota
	// DoUpdate overwrites the row: the last write of a key wins.
	DoUpdate
)

// ParseOnConflict reads "nothing" or "update".
func ParseOnConflict(s string) (OnConflict, error) {
	switch s {
	case "nothing", "":
		return DoNothing, nil
	case "update":
		return DoUpdate, nil
	}
	return 0, fmt.Errorf("unknown on-conflict action %q: want nothing or update", s)
}

func (c OnConflict) String() string {
	if c == DoUpdate {
		return "update"
	}
	return "nothing"
}

// Defaults of Options.
const (
	DefaultTable            = "events"
	DefaultMaxBatch         = 500
	DefaultFlushers         = 4
	DefaultStatementTimeout = 10 * time.Second
)

// Options configure a Sink. The zero value is valid.
type Options struct {
	// Table is "name" or "schema.name"; created when absent.
	Table      string
	OnConflict OnConflict
	// MaxBatch caps the rows of one statement.
	MaxBatch int
	// Flushers is how many statements run at once. While they run, new
	// writes gather into the next batch, so batches grow with the load.
	Flushers int
	// StatementTimeout bounds one batch statement, so a hung server turns
	// into errors (and retries) instead of writes that never return.
	StatementTimeout time.Duration
	Logger           *slog.Logger
}

func (o *Options) defaults() {
	if o.Table == "" {
		o.Table = DefaultTable
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	if o.Flushers <= 0 {
		o.Flushers = DefaultFlushers
	}
	if o.StatementTimeout <= 0 {
		o.StatementTimeout = DefaultStatementTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}

// Stats are counters of a Sink.
type Stats struct {
	Batches  int64 // statements that committed
	Rows     int64 // distinct keys sent in committed statements
	Inserted int64 // rows the server inserted or updated (the rest were conflicts)
	Failed   int64 // statements that failed
}

// Sink writes messages to a PostgreSQL table.
type Sink struct {
	pool     *pgxpool.Pool
	ownPool  bool
	table    pgx.Identifier
	insert   string
	opt      Options
	log      *slog.Logger
	gather   *writes.Gatherer[row]
	stopOnce sync.Once
	// callsMu guards closed and calls: WriteBatch runs its statements on
	// its caller's goroutine, and Close waits for them.
	callsMu sync.Mutex
	closed  bool
	calls   sync.WaitGroup
	ctx     context.Context // outlives every statement; cancelled by Close last
	cancel  context.CancelFunc

	batchesOK, rows, inserted, failed atomic.Int64
}

var _ sink.BatchSink = (*Sink)(nil)

// Open connects to url (a postgres:// URL or key=value DSN), creates or
// checks the table, and starts the batcher. The pool is the sink's and
// holds at least one connection per flusher.
func Open(ctx context.Context, url string, o Options) (*Sink, error) {
	o.defaults()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: cannot parse the connection URL%s (want postgres://user@host:port/db?...)", parseProblem(err))
	}
	if cfg.MaxConns < int32(o.Flushers) {
		cfg.MaxConns = int32(o.Flushers)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	s, err := newSink(ctx, pool, o)
	if err != nil {
		pool.Close()
		return nil, err
	}
	s.ownPool = true
	return s, nil
}

// parseProblem is what pgx found wrong in a connection string (": invalid
// port"), without the string: pgx masks its password on a best-effort
// basis only, which a malformed URL can defeat. The prefix pgx writes
// before the problem is made again from the same string, so it is cut
// exactly whatever the string holds.
func parseProblem(err error) string {
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return ""
	}
	prefix := pgconn.NewParseConfigError(pe.ConnString, "", nil).Error()
	problem, ok := strings.CutPrefix(pe.Error(), prefix)
	if !ok || problem == "" {
		return ""
	}
	return ": " + problem
}

// New is Open over a pool the caller owns (and closes after the sink).
func New(ctx context.Context, pool *pgxpool.Pool, o Options) (*Sink, error) {
	o.defaults()
	return newSink(ctx, pool, o)
}

func newSink(ctx context.Context, pool *pgxpool.Pool, o Options) (*Sink, error) {
	t, err := ParseTable(o.Table)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	created, err := ensureTable(ctx, pool, t)
	if err != nil {
		return nil, fmt.Errorf("postgres sink: %w", err)
	}
	s := &Sink{
		pool:   pool,
		table:  t,
		insert: insertSQL(t, o.OnConflict),
		opt:    o,
		log:    o.Logger,
	}
	// Statements run on a context of the sink's, not of any one writer: a
	// batch serves many writers, and one giving up must not fail the rest.
	s.ctx, s.cancel = context.WithCancel(context.WithoutCancel(ctx))
	// StatementTimeout bounds each statement of a gathered batch already.
	s.gather = writes.NewGatherer(ctx, writes.Gathering{Max: o.MaxBatch, Flushers: o.Flushers, Closed: ErrClosed}, s.flush)
	s.log.Info("postgres sink ready", "table", t.Sanitize(), "created", created,
		"on_conflict", o.OnConflict.String(), "max_batch", o.MaxBatch, "flushers", o.Flushers)
	return s, nil
}

// insertSQL is the one statement of a batch: parallel arrays, one per column,
// unnested into rows. One statement parses and plans once for the whole
// batch, which measured about twice the rate of a pipelined batch of
// single-row INSERTs.
func insertSQL(t pgx.Identifier, c OnConflict) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(t.Sanitize())
	b.WriteString(" (key, message_id, data, data_json, attributes, event_time, publish_time)\n")
	b.WriteString("SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[], $4::jsonb[], $5::jsonb[], $6::timestamptz[], $7::timestamptz[])\n")
	if c == DoUpdate {
		b.WriteString("ON CONFLICT (key) DO UPDATE SET message_id = excluded.message_id, data = excluded.data, " +
			"data_json = excluded.data_json, attributes = excluded.attributes, event_time = excluded.event_time, " +
			"publish_time = excluded.publish_time, written_at = now()")
	} else {
		b.WriteString("ON CONFLICT (key) DO NOTHING")
	}
	return b.String()
}

// Table is the quoted table name.
func (s *Sink) Table() string { return s.table.Sanitize() }

// Stats returns the counters so far.
func (s *Sink) Stats() Stats {
	return Stats{Batches: s.batchesOK.Load(), Rows: s.rows.Load(), Inserted: s.inserted.Load(), Failed: s.failed.Load()}
}

// Write implements sink.Sink: it returns nil once the row of m's key is
// committed (inserted now, or already there). m's key is the dedup key; a
// message passed without dedup is keyed on its message ID. An error wraps
// sink.ErrPermanent when the message cannot be stored at all, and
// ErrUnavailable (which matches dedup.ErrUnavailable too) when the server
// cannot be reached.
//
// When ctx ends first, Write returns its error, but the row may still be
// committed by the statement already under way; the retry that follows is
// then a no-op.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	r, err := encode(m)
	if err != nil {
		return fmt.Errorf("write message %s to %s: %w", m.ID, s.table.Sanitize(), err)
	}
	err = s.gather.Write(ctx, r)
	if err != nil && err == context.Cause(ctx) {
		return fmt.Errorf("write key %q to %s: %w", r.key, s.table.Sanitize(), err)
	}
	return err
}

// Close stops taking writes, finishes the batches under way (each bounded
// by StatementTimeout) and, when Open made the pool, closes it.
func (s *Sink) Close() {
	s.stopOnce.Do(func() {
		s.callsMu.Lock()
		s.closed = true
		s.callsMu.Unlock()
		s.gather.Close()
		s.calls.Wait()
		s.cancel()
		if s.ownPool {
			s.pool.Close()
		}
	})
}
