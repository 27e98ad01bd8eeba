// Package bigquery is the BigQuery sink: each message becomes one row of an
// existing table, appended through the Storage Write API, the row carrying
// the message's dedup key in a column.
//
// # What a re-write costs, and why this design
//
// The pipeline writes a message again only when its key's earlier write may
// have landed but was never committed: the process died (or stalled past its
// claim's lease) between the append and the commit, or the append failed
// without a verdict. BigQuery offers three ways to append, checked:
//
//   - The _default stream is at-least-once: a row appended twice is two rows.
//   - A COMMITTED stream with offsets writes an offset at most once, but only
//     when the same rows come back at the same offsets of the same stream.
//     After a crash the stream was the dead process's, and the redelivered
//     batch holds other messages in another order, so offsets dedupe nothing
//     that matters here (and each process would spend a CreateWriteStream).
//   - A table with a primary key takes _CHANGE_TYPE UPSERT rows (change data
//     capture), a keyed upsert; it needs such a table, applies in the
//     background, and no local server implements it, so nothing here could
//     prove it.
//
// So rows go to the _default stream, and the sink closes its gap itself: a
// message whose key a stopped process may have written (sink.Message.Retaken:
// its key was taken over from a lapsed claim, or it came in the first horizon
// after this process started) or whose earlier append in this process failed
// without a verdict is looked up in the table first, one query per batch
// that holds any such message. A key already there is reported written
// without a second row. A row whose append answered is visible to queries
// at once, so the lookup finds every write that finished before the old
// process died.
//
// What is left: an append still in flight when its process died that the
// server applies after the new owner's lookup, and a replica that died
// while the others ran on past their first horizon. Each such row is an
// extra row with the same key; the view DedupView hides it.
package bigquery

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/dedup"
	bq "github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
	"github.com/dedupflow/dedupflow/sink/internal/writes"
)

// Options configure a Sink.
type Options struct {
	// Table is the table's name in the dataset. It must exist.
	Table string
	// Metadata are the metadata columns written; the key's is required.
	Metadata columns.Metadata
	// Fields are the JSON payload's fields written to columns of the same
	// names. Empty means every column that is not a metadata column; a
	// table of metadata columns only does not read the payload.
	Fields []string
	// Subscription is the input's full name, for the subscription_name
	// column.
	Subscription string
	// MaxRequestBytes caps one AppendRows request; zero is the service's
	// 10 MB. A server that takes less says so, and the sink follows it.
	MaxRequestBytes int
	// Endpoints, zero for Google; bq.EndpointsFromEnv for an emulator.
	Endpoints bq.Endpoints
	// BatchTimeout bounds a batch of gathered Writes, for writers that
	// set no deadline (DefaultBatchTimeout when zero); a batch ends at its
	// writers' latest deadline when that comes sooner.
	BatchTimeout time.Duration
	Logger       *slog.Logger
}

// DefaultBatchTimeout is Options.BatchTimeout's default.
const DefaultBatchTimeout = writes.DefaultTimeout

// ErrClosed is returned by Write after Close.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("bigquery sink closed: %w", dedup.ErrFatal)

// maxUnsure bounds the keys remembered as maybe written, so a long outage
// cannot grow the set without end; past it a failed key is not looked up
// again, and may cost an extra row.
const maxUnsure = 100_000

// Stats count what a Sink did.
type Stats struct {
	Appended int64 // rows appended
	Present  int64 // messages found in the table already, not appended again
	Lookups  int64 // lookup queries run
	Appends  int64 // appends of a batch's rows, each of one or more AppendRows requests
}

// Sink appends messages to a BigQuery table.
type Sink struct {
	c         *bq.Client
	t         *bq.Table
	w         *bq.Writer
	md        columns.Metadata
	key       string // the key's column
	enc       bq.Options
	sub       string
	log       *slog.Logger
	mu        sync.Mutex
	unsure    map[string]bool // keys whose append failed without a verdict
	gather    *writes.Gatherer[*sink.Message]
	stats     struct{ appended, present, lookups, appends atomic.Int64 }
	closeOnce sync.Once
}

// Open opens the table that url (bigquery://PROJECT/DATASET) and
// o.Table name, and checks, one line each, the credentials, the dataset
// and table, and that the rows fit the table's schema.
func Open(ctx context.Context, url string, o Options) (*Sink, error) {
	project, dataset, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.BatchTimeout <= 0 {
		o.BatchTimeout = DefaultBatchTimeout
	}
	key := o.Metadata.Names[columns.Key]
	if key == "" {
		return nil, errors.New("the BigQuery sink writes the dedup key to a column, so --metadata-columns must include key")
	}
	c, err := bq.Open(ctx, project, o.Endpoints)
	if err != nil {
		return nil, err
	}
	s, err := open(ctx, c, bq.TableRef{Dataset: dataset, Table: o.Table}, key, o)
	if err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

func open(ctx context.Context, c *bq.Client, ref bq.TableRef, key string, o Options) (*Sink, error) {
	t, err := c.Table(ctx, ref)
	if err != nil {
		return nil, err
	}
	enc := bq.Options{Fields: o.Fields, DropUnknownFields: true}
	for _, f := range t.Schema {
		if !o.Metadata.Has(f.Name) {
			enc.UseTableSchema = true
		}
	}
	// A sample of the metadata values, for their columns' types.
	sample, err := o.Metadata.Values(&sink.Message{ID: "m"}, o.Subscription)
	if err != nil {
		return nil, err
	}
	if err := t.Fits(values(sample), enc); err != nil {
		return nil, err
	}
	w, err := c.NewWriter(ctx, t, o.MaxRequestBytes, o.Logger)
	if err != nil {
		return nil, err
	}
	s := &Sink{c: c, t: t, w: w, md: o.Metadata, key: key, enc: enc, sub: o.Subscription,
		log: o.Logger, unsure: map[string]bool{}}
	s.gather = writes.NewGatherer(ctx, writes.Gathering{Max: writes.DefaultMax, Flushers: writes.DefaultFlushers,
		Timeout: o.BatchTimeout, Closed: ErrClosed}, s.WriteBatch)
	return s, nil
}

// ParseURL reads bigquery://PROJECT/DATASET.
func ParseURL(url string) (project, dataset string, err error) {
	rest, ok := strings.CutPrefix(url, "bigquery://")
	project, dataset, _ = strings.Cut(rest, "/")
	if !ok || project == "" || dataset == "" || strings.Contains(dataset, "/") {
		return "", "", fmt.Errorf("--sink %q: want bigquery://PROJECT/DATASET", url)
	}
	return project, dataset, nil
}

func values(vs []columns.Value) []bq.Value {
	out := make([]bq.Value, len(vs))
	for i, v := range vs {
		out[i] = bq.Value{Column: v.Name, V: v.V}
	}
	return out
}

// Stats are the sink's counters so far.
func (s *Sink) Stats() Stats {
	return Stats{s.stats.appended.Load(), s.stats.present.Load(), s.stats.lookups.Load(), s.stats.appends.Load()}
}

// Table is the table written, as a query names it (PROJECT.DATASET.TABLE).
func (s *Sink) Table() string { return s.t.String() }

// Close finishes the gathered batches, then closes the stream and the
// connections.
func (s *Sink) Close() {
	s.gather.Close()
	s.closeOnce.Do(func() {
		if err := errors.Join(s.w.Close(), s.c.Close()); err != nil {
			s.log.Warn("bigquery sink: closing", "err", err)
		}
	})
}

// Write writes one message, gathered with the Writes that arrive with it
// into one batch (see WriteBatch); it returns once its row is in the table.
func (s *Sink) Write(ctx context.Context, m *sink.Message) error {
	err := s.gather.Write(ctx, m)
	if err != nil && err == context.Cause(ctx) {
		return fmt.Errorf("write message %s to %s: %w", m.ID, s.t, err)
	}
	return err
}

// WriteBatch implements sink.BatchSink. A message that does not fit the
// table fails alone with sink.ErrPermanent and the column at fault; a
// message whose key may be in the table already is looked up first.
// Copies of a key in one batch are folded into the first one's row, as
// two writes in arrival order would leave one, and share its outcome.
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	rows := make([][]byte, 0, len(ms))
	at := make([]int, 0, len(ms)) // the message of each row
	var check []int
	first := make(map[string]int, len(ms)) // key -> the message written for it
	var copies [][2]int                    // a copy and the message written for it
	defer func() {
		for _, c := range copies {
			errs[c[0]] = errs[c[1]]
		}
	}()
	for i, m := range ms {
		if j, ok := first[columns.KeyOf(m)]; ok {
			copies = append(copies, [2]int{i, j})
			continue
		}
		vs, err := s.md.Values(m, s.sub)
		if err == nil {
			var row []byte
			if row, err = s.t.Encode(bq.Row{Data: m.Data, Meta: values(vs)}, s.enc); err == nil {
				first[columns.KeyOf(m)] = i
				rows, at = append(rows, row), append(at, i)
				if m.Retaken || s.isUnsure(columns.KeyOf(m)) {
					check = append(check, len(rows)-1)
				}
				continue
			}
		}
		errs[i] = s.fail(m, err)
	}
	if len(check) > 0 {
		rows, at = s.drop(ctx, ms, rows, at, check, errs)
	}
	if len(rows) == 0 {
		return
	}
	s.stats.appends.Add(1)
	for j, err := range s.w.Append(ctx, rows) {
		m := ms[at[j]]
		if err != nil {
			errs[at[j]] = s.fail(m, err)
			continue
		}
		errs[at[j]] = nil
		s.stats.appended.Add(1)
		s.setUnsure(columns.KeyOf(m), false)
	}
}

// drop looks up the keys of rows[check] and removes those found from
// rows and at, reporting their messages written. When the lookup fails,
// those messages fail with it and come back later.
func (s *Sink) drop(ctx context.Context, ms []*sink.Message, rows [][]byte, at, check []int, errs []error) ([][]byte, []int) {
	keys := make([]string, len(check))
	for j, r := range check {
		keys[j] = columns.KeyOf(ms[at[r]])
	}
	s.stats.lookups.Add(1)
	found, err := s.c.Present(ctx, s.t, s.key, keys)
	skip := make(map[int]bool, len(check))
	for _, r := range check {
		i := at[r]
		switch k := columns.KeyOf(ms[i]); {
		case err != nil:
			errs[i] = classify(fmt.Errorf("key %q may be in %s already: %w", k, s.t, err))
			skip[r] = true
		case found[k]:
			errs[i] = nil
			skip[r] = true
			s.stats.present.Add(1)
			s.setUnsure(k, false)
			s.log.Debug("bigquery sink: key already in the table, not appended again", "key", k, "table", s.t.String())
		}
	}
	keptRows, keptAt := rows[:0], at[:0]
	for r := range rows {
		if !skip[r] {
			keptRows, keptAt = append(keptRows, rows[r]), append(keptAt, at[r])
		}
	}
	return keptRows, keptAt
}

// fail is m's error: permanent when m does not fit the table, else a
// failure whose row may have landed, so its key is looked up next time.
func (s *Sink) fail(m *sink.Message, err error) error {
	if errors.Is(err, bq.ErrUnfit) || errors.Is(err, bq.ErrTooLarge) || errors.Is(err, sink.ErrPermanent) {
		return fmt.Errorf("message %s to %s: %w: %w", m.ID, s.t, sink.ErrPermanent, err)
	}
	s.setUnsure(columns.KeyOf(m), true)
	return classify(fmt.Errorf("message %s to %s: %w", m.ID, s.t, err))
}

func (s *Sink) isUnsure(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.unsure[key]
}

func (s *Sink) setUnsure(key string, on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !on:
		delete(s.unsure, key)
	case len(s.unsure) < maxUnsure:
		s.unsure[key] = true
	}
}

// classify marks errors the pipeline branches on: a service that is down
// or overloaded (it backs off), and one that refuses what only an
// operator can fix (it stops).
func classify(err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted:
		return fmt.Errorf("%w: %w", dedup.ErrUnavailable, err)
	case codes.PermissionDenied, codes.Unauthenticated, codes.NotFound:
		return fmt.Errorf("%w: %w", dedup.ErrFatal, err)
	}
	return err
}

// DedupView is the query of a view over table that shows each key once,
// its earliest publish: any extra row a crash left is hidden.
func DedupView(table, key, publishTime string) string {
	return fmt.Sprintf("SELECT * FROM `%s` WHERE TRUE QUALIFY ROW_NUMBER() OVER (PARTITION BY `%s` ORDER BY `%s`) = 1",
		table, key, publishTime)
}
