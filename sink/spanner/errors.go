package spanner

import (
	"context"
	"errors"
	"fmt"

	"cloud.google.com/go/spanner"
	"google.golang.org/grpc/codes"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
)

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("spanner sink closed")

// ErrUnavailable marks errors of a service that is down, overloaded or
// unreachable: the pipeline backs off and retries. It matches
// dedup.ErrUnavailable.
var ErrUnavailable error = unavailable{}

type unavailable struct{}

func (unavailable) Error() string        { return "spanner sink unavailable" }
func (unavailable) Is(target error) bool { return target == dedup.ErrUnavailable }

// ErrRefused marks what an operator has to fix: credentials, a permission,
// a database or table that is not there, a schema the messages cannot fit.
// It matches dedup.ErrFatal, so the pipeline stops with it.
var ErrRefused error = refused{}

type refused struct{}

func (refused) Error() string        { return "spanner sink refused" }
func (refused) Is(target error) bool { return target == dedup.ErrFatal }

// errInvalid marks a message the table cannot hold; it wraps
// sink.ErrPermanent so the message is dead-lettered, with the column.
var errInvalid = fmt.Errorf("%w: does not fit the Spanner table", sink.ErrPermanent)

// classify wraps err so callers can branch on it. Codes about the data of
// a commit (InvalidArgument and the like) are left as they are: the batch
// is split to find the row (see rowError).
func classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) || errors.Is(err, sink.ErrPermanent) {
		return err
	}
	switch spanner.ErrCode(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Internal:
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("%w: %w", ErrRefused, err)
	}
	return err
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
