package bigquery

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// serverMax reads the limit from gRPC's refusal of a large message, as
// goccy/bigquery-emulator sends it (TestAppendLearnsServerLimit meets it
// for real), and from nothing else.
func TestServerMax(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{status.Error(codes.ResourceExhausted, "grpc: received message larger than max (6291612 vs. 4194304)"), 4194304},
		{status.Error(codes.ResourceExhausted, "Exceeds 'AppendRows throughput' quota"), 0},
		{status.Error(codes.InvalidArgument, "larger than max (2 vs. 4194304)"), 0},
		{status.Error(codes.ResourceExhausted, "larger than max (2 vs. 10)"), 0}, // too small to fill
		{errors.New("larger than max (2 vs. 4194304)"), 0},
	} {
		if got, ok := serverMax(tc.err); got != tc.want || ok != (tc.want > 0) {
			t.Errorf("serverMax(%v) = %d, %v; want %d", tc.err, got, ok, tc.want)
		}
	}
}
