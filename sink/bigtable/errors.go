package bigtable

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
)

// ErrClosed is returned by writes after Close.
var ErrClosed = errors.New("bigtable sink closed")

// ErrUnavailable marks errors of a service that is down, overloaded or
// unreachable: the pipeline backs off and retries. It matches
// dedup.ErrUnavailable.
var ErrUnavailable error = unavailable{}

type unavailable struct{}

func (unavailable) Error() string        { return "bigtable sink unavailable" }
func (unavailable) Is(target error) bool { return target == dedup.ErrUnavailable }

// ErrRefused marks what an operator has to fix: credentials, a permission,
// a table or column family that is not there.
// It matches dedup.ErrFatal, so the pipeline stops with it.
var ErrRefused error = refused{}

type refused struct{}

func (refused) Error() string        { return "bigtable sink refused" }
func (refused) Is(target error) bool { return target == dedup.ErrFatal }

// errInvalid marks a message the table cannot hold; it wraps
// sink.ErrPermanent so the message is dead-lettered, with the column.
var errInvalid = fmt.Errorf("%w: does not fit the Bigtable table", sink.ErrPermanent)

// classify wraps err so callers can branch on it; other codes are
// returned as they are, and the message is retried.
func classify(err error) error {
	if err == nil || errors.Is(err, ErrUnavailable) || errors.Is(err, ErrRefused) || errors.Is(err, sink.ErrPermanent) {
		return err
	}
	switch status.Code(err) {
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

// rowError reports whether err, an entry's, is the server refusing its
// data: a value too large, say.
func rowError(err error) bool {
	switch status.Code(err) {
	case codes.InvalidArgument, codes.OutOfRange:
		return true
	}
	return false
}
