package postgres

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dedupflow/dedupflow/dedup"
)

// ErrClosed is returned by Write after Close.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("postgres sink closed: %w", dedup.ErrFatal)

// ErrUnavailable marks errors of a server that is down, restarting,
// overloaded or unreachable. It also matches dedup.ErrUnavailable, so
// callers that already branch on the store's sentinel treat a sink outage
// the same way; only the text differs, so a log says which of the two went
// away.
var ErrUnavailable error = unavailable{}

type unavailable struct{}

func (unavailable) Error() string        { return "postgres sink unavailable" }
func (unavailable) Is(target error) bool { return target == dedup.ErrUnavailable }

// ErrRefused marks errors that retrying cannot fix: the server refused the
// credentials or the privilege, the database or the table is gone. It
// matches dedup.ErrFatal, so the pipeline stops with it and exits non-zero
// (after a restart, a dropped table is created again).
var ErrRefused error = refused{}

type refused struct{}

func (refused) Error() string        { return "postgres sink refused" }
func (refused) Is(target error) bool { return target == dedup.ErrFatal }

// classify wraps err so callers can branch on it: ErrUnavailable for a
// server that is down, restarting, overloaded or unreachable (the pipeline
// backs off and retries; the pool reconnects by itself), ErrRefused for
// what an operator has to fix. Other server errors are returned as they
// are, and the message is retried.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) {
		return err
	}
	if transient(err) {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if permanent(err) {
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
}

// permanent reports whether the server refused for a reason no retry
// changes.
func permanent(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case pe.Code[:2] == "28": // invalid authorization: a wrong password, a removed role
		return true
	case pe.Code == "3D000", // the database does not exist
		pe.Code == "42501", // insufficient privilege
		pe.Code == "42P01": // the table does not exist
		return true
	}
	return false
}

// transient reports whether err is about the server or the connection
// rather than the statement.
func transient(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		// Not an answer from the server: dial errors, a reset or closed
		// connection, a timeout waiting for a reply.
		return !errors.Is(err, context.Canceled)
	}
	switch pe.Code[:2] {
	case "08", // connection exception
		"53", // insufficient resources: too many connections, disk full
		"57": // operator intervention: shutdown, terminated backend, statement timeout
		return true
	}
	switch pe.Code {
	case "40001", "40P01", // serialization failure, deadlock: retry the transaction
		"55P03": // lock not available
		return true
	}
	return false
}

// rowError reports whether err is about the data of some row: the server
// refused a value (class 22), a constraint of the table (class 23, such as a
// CHECK or another unique index a user added) or a size limit (class 54,
// such as an index entry too large). Retrying the same row cannot help;
// the batch is split to find the row.
func rowError(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code[:2] {
	case "22", "23", "54":
		return true
	}
	return false
}
