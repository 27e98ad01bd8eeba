package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink"
)

// TestClassify: each code lands in the class the pipeline branches on, and
// a canceled call, a permanent error or a classified one stays as it was.
func TestClassify(t *testing.T) {
	down, refused := Unavailable("t"), Refused("t")
	base := errors.New("rpc failed")
	for _, c := range []struct {
		err  error
		code codes.Code
		want error // the sentinel it must match, nil for none
	}{
		{base, codes.Unavailable, dedup.ErrUnavailable},
		{base, codes.DeadlineExceeded, dedup.ErrUnavailable},
		{base, codes.PermissionDenied, dedup.ErrFatal},
		{base, codes.NotFound, dedup.ErrFatal},
		{base, codes.InvalidArgument, nil},
		{fmt.Errorf("%w", context.Canceled), codes.Unavailable, nil},
		{fmt.Errorf("%w: too long", sink.ErrPermanent), codes.Unavailable, nil},
	} {
		got := Classify(c.err, c.code, down, refused)
		for _, s := range []error{dedup.ErrUnavailable, dedup.ErrFatal} {
			if errors.Is(got, s) != (s == c.want) {
				t.Errorf("%v with %v: %v, matches %v: %v", c.err, c.code, got, s, errors.Is(got, s))
			}
		}
		if !errors.Is(got, c.err) {
			t.Errorf("%v with %v: %v lost the cause", c.err, c.code, got)
		}
	}
	if down.Error() != "t sink unavailable" || refused.Error() != "t sink refused" {
		t.Errorf("names %q and %q", down, refused)
	}
}
