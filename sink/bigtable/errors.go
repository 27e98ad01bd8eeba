package bigtable

import (
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/internal/rpcerr"
)

// ErrClosed is returned by writes after Close.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("bigtable sink closed: %w", dedup.ErrFatal)

// ErrUnavailable marks errors of a service that is down, overloaded or
// unreachable: the pipeline backs off and retries. It matches
// dedup.ErrUnavailable.
var ErrUnavailable error = rpcerr.Unavailable("bigtable")

// ErrRefused marks what an operator has to fix: credentials, a permission,
// a table or column family that is not there.
// It matches dedup.ErrFatal, so the pipeline stops with it.
var ErrRefused error = rpcerr.Refused("bigtable")

// errInvalid marks a message the table cannot hold; it wraps
// sink.ErrPermanent so the message is dead-lettered, with the column.
var errInvalid = fmt.Errorf("%w: does not fit the Bigtable table", sink.ErrPermanent)

// classify wraps err so callers can branch on it; other codes are
// returned as they are, and the message is retried.
func classify(err error) error {
	return rpcerr.Classify(err, status.Code(err), ErrUnavailable, ErrRefused)
}

// rowError reports whether err, an entry's, is the server refusing its
// data: a value too large, say.
func rowError(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		return true
	}
	return false
}
