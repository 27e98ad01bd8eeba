// Package rpcerr sorts the errors of a sink whose service answers in gRPC
// codes (Spanner, Bigtable) into what the pipeline branches on: a service
// that is down (back off and retry), a refusal an operator has to fix
// (stop), or anything else (retry the message).
package rpcerr

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
)

// Class is a class of a sink's errors, named for the sink, that matches
// the dedup sentinel the pipeline branches on.
type Class struct {
	msg    string
	target error
}

func (c Class) Error() string        { return c.msg }
func (c Class) Is(target error) bool { return target == c.target }

// Unavailable is the class of a service that is down, overloaded or
// unreachable; it matches dedup.ErrUnavailable.
func Unavailable(name string) Class { return Class{name + " sink unavailable", dedup.ErrUnavailable} }

// Refused is the class of what an operator has to fix (credentials, a
// permission, something that is not there); it matches dedup.ErrFatal.
func Refused(name string) Class { return Class{name + " sink refused", dedup.ErrFatal} }

// Classify wraps err, whose gRPC code is code, in unavailable or refused;
// other codes, and errors already classified, are returned as they are.
func Classify(err error, code codes.Code, unavailable, refused error) error {
	if err == nil || errors.Is(err, unavailable) || errors.Is(err, refused) || errors.Is(err, sink.ErrPermanent) {
		return err
	}
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted, codes.Internal:
		if errors.Is(err, context.Canceled) {
			return err
		}
		return fmt.Errorf("%w: %w", unavailable, err)
	case codes.NotFound, codes.PermissionDenied, codes.Unauthenticated:
		return fmt.Errorf("%w: %w", refused, err)
	}
	return err
}
