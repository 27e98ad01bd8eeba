package spanner

import (
	"fmt"

	"cloud.google.com/go/spanner"
	"google.golang.org/grpc/codes"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/internal/rpcerr"
)

// ErrClosed is returned by writes after Close.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("spanner sink closed: %w", dedup.ErrFatal)

// ErrUnavailable marks errors of a service that is down, overloaded or
// unreachable: the pipeline backs off and retries. It matches
// dedup.ErrUnavailable.
var ErrUnavailable error = rpcerr.Unavailable("spanner")

// ErrRefused marks what an operator has to fix: credentials, a permission,
// a database or table that is not there, a schema the messages cannot fit.
// It matches dedup.ErrFatal, so the pipeline stops with it.
var ErrRefused error = rpcerr.Refused("spanner")

// errInvalid marks a message the table cannot hold; it wraps
// sink.ErrPermanent so the message is dead-lettered, with the column.
var errInvalid = fmt.Errorf("%w: does not fit the Spanner table", sink.ErrPermanent)

// classify wraps err so callers can branch on it. Codes about the data of
// a commit (InvalidArgument and the like) are left as they are: the batch
// is split to find the row (see rowError).
func classify(err error) error {
	return rpcerr.Classify(err, spanner.ErrCode(err), ErrUnavailable, ErrRefused)
}

// rowError reports whether err is the server refusing the data of some
// row of a commit: a value too long, a check or a unique index.
func rowError(err error) bool {
	switch spanner.ErrCode(err) {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange, codes.AlreadyExists:
		return true
	}
	return false
}
