package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/dedupflow/dedupflow/sink"
)

// flush stores one gathered batch; its statements end by the batch's
// deadline, its writers' latest.
func (s *Sink) flush(ctx context.Context, rows []row, errs []error) {
	by, _ := ctx.Deadline()
	s.write(rows, by, errs)
}

// WriteBatch implements sink.BatchSink: the rows of ms in one statement
// (one per MaxBatch rows), run on the caller's goroutine rather than
// gathered with other writers' rows. A message that cannot be encoded, or
// a row the server refuses, fails alone and permanently; a statement that
// fails otherwise fails the messages it carried. Each statement ends by
// StatementTimeout or by ctx's deadline, whichever is sooner, and none
// starts once ctx ended; a cancel without a deadline does not stop a
// statement under way, which may commit after ctx ended (the retry that
// follows is then a no-op).
func (s *Sink) WriteBatch(ctx context.Context, ms []*sink.Message, errs []error) {
	s.callsMu.Lock()
	if s.closed {
		s.callsMu.Unlock()
		for i := range errs {
			errs[i] = ErrClosed
		}
		return
	}
	s.calls.Add(1)
	s.callsMu.Unlock()
	defer s.calls.Done()
	rows := make([]row, 0, len(ms))
	at := make([]int, 0, len(ms)) // the message of each row
	for i, m := range ms {
		r, err := encode(m)
		if err != nil {
			errs[i] = fmt.Errorf("write message %s to %s: %w", m.ID, s.table.Sanitize(), err)
			continue
		}
		if err := ctx.Err(); err != nil {
			errs[i] = fmt.Errorf("write key %q to %s: %w", r.key, s.table.Sanitize(), context.Cause(ctx))
			continue
		}
		rows, at = append(rows, r), append(at, i)
	}
	by, _ := ctx.Deadline()
	part := make([]error, min(len(rows), s.opt.MaxBatch))
	for len(rows) > 0 {
		if err := ctx.Err(); err != nil {
			for j, r := range rows {
				errs[at[j]] = fmt.Errorf("write key %q to %s: %w", r.key, s.table.Sanitize(), context.Cause(ctx))
			}
			return
		}
		n := min(len(rows), s.opt.MaxBatch)
		s.write(rows[:n], by, part[:n])
		for j := range n {
			errs[at[j]] = part[j]
		}
		rows, at = rows[n:], at[n:]
	}
}

// write stores rows in one statement, copies of a key folded, and sets
// errs[i] to rows[i]'s outcome. No statement runs past by, unless by is
// zero.
func (s *Sink) write(rows []row, by time.Time, errs []error) {
	folded, owner := s.dedupe(rows)
	rerrs := s.store(folded, by)
	for i := range rows {
		errs[i] = rerrs[owner[i]]
	}
}

// dedupe returns one row per key and, for each of rows, the index of the
// row that stands for it. ON CONFLICT DO UPDATE cannot touch one row twice
// in a statement, so copies of a key in one batch must be folded: the first
// wins under DO NOTHING, the last under DO UPDATE — what two statements in
// arrival order would have left. Every copy gets its row's result.
func (s *Sink) dedupe(rows []row) ([]row, []int) {
	out := make([]row, 0, len(rows))
	owner := make([]int, len(rows))
	at := make(map[string]int, len(rows))
	for i, r := range rows {
		if j, ok := at[r.key]; ok {
			if s.opt.OnConflict == DoUpdate {
				out[j] = r
			}
			owner[i] = j
			continue
		}
		at[r.key] = len(out)
		owner[i] = len(out)
		out = append(out, r)
	}
	return out, owner
}

// store writes rows in one statement and returns each row's result. When
// the server refuses the data of some row, the batch is retried row by row
// so only that row fails (permanently) and the others are written. No
// statement runs past by, unless by is zero.
func (s *Sink) store(rows []row, by time.Time) []error {
	errs := make([]error, len(rows))
	err := s.exec(rows, by)
	if err != nil && rowError(err) && len(rows) > 1 {
		s.log.Warn("the server refused a row of a batch; writing its rows one by one to find it",
			"table", s.table.Sanitize(), "rows", len(rows), "err", err)
		for i := range rows {
			errs[i] = s.storeOne(&rows[i], by)
		}
		return errs
	}
	if err != nil {
		if len(rows) == 1 && rowError(err) {
			errs[0] = s.storeOne(&rows[0], by)
			return errs
		}
		err = fmt.Errorf("insert %d rows into %s: %w", len(rows), s.table.Sanitize(), classify(err))
	}
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// storeOne writes a single row after its batch failed on data.
func (s *Sink) storeOne(r *row, by time.Time) error {
	one := []row{*r}
	err := s.exec(one, by)
	if err != nil && rowError(err) && r.dataJSON != nil {
		// jsonb refused a payload that passed our checks (a number beyond
		// numeric's range, nesting deeper than the server's stack). The
		// data column keeps the bytes; only the JSON copy is left out.
		one[0].dataJSON = nil
		err = s.exec(one, by)
	}
	switch {
	case err == nil:
		return nil
	case rowError(err):
		s.log.Warn("row refused by the server; the message goes to the dead-letter topic",
			"table", s.table.Sanitize(), "key", r.key, "message_id", r.messageID, "err", err)
		return fmt.Errorf("insert key %q into %s: %w: %w", r.key, s.table.Sanitize(), sink.ErrPermanent, err)
	}
	return fmt.Errorf("insert key %q into %s: %w", r.key, s.table.Sanitize(), classify(err))
}

// maxAttempts bounds tries of one statement. One retry covers the common
// case of a connection the server closed (a restart, pg_terminate_backend)
// after the pool handed it out; more are the pipeline's business, with its
// backoff. Retrying is always safe: the statement is idempotent.
const maxAttempts = 2

// exec runs the insert for rows and waits for its commit (a lone statement
// is its own transaction), for at most StatementTimeout and never past by
// (unless by is zero).
func (s *Sink) exec(rows []row, by time.Time) error {
	args := columnsOf(rows)
	var err error
	for range maxAttempts {
		end := time.Now().Add(s.opt.StatementTimeout)
		if !by.IsZero() && by.Before(end) {
			end = by
		}
		ctx, cancel := context.WithDeadline(s.ctx, end)
		tag, e := s.pool.Exec(ctx, s.insert, args...)
		cancel()
		if e == nil {
			s.batchesOK.Add(1)
			s.rows.Add(int64(len(rows)))
			s.inserted.Add(tag.RowsAffected())
			return nil
		}
		err = e
		if !transient(err) || s.ctx.Err() != nil || !by.IsZero() && !time.Now().Before(by) {
			break
		}
	}
	s.failed.Add(1)
	return err
}

// columnsOf turns rows into the statement's parallel arrays.
func columnsOf(rows []row) []any {
	var (
		keys     = make([]string, len(rows))
		ids      = make([]string, len(rows))
		data     = make([][]byte, len(rows))
		dataJSON = make([]json.RawMessage, len(rows)) // nil elements are NULL
		attrs    = make([]json.RawMessage, len(rows))
		events   = make([]time.Time, len(rows))
		publish  = make([]time.Time, len(rows))
	)
	for i, r := range rows {
		keys[i], ids[i], data[i], dataJSON[i] = r.key, r.messageID, r.data, r.dataJSON
		attrs[i], events[i], publish[i] = r.attributes, r.eventTime, r.publish
	}
	return []any{keys, ids, data, dataJSON, attrs, events, publish}
}
