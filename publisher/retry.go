package publisher

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Backoff is the pause between attempts: Initial after the first failure,
// multiplied by Multiplier after each further one, capped at Max. Each
// pause is jittered down by up to half, so many publishers that failed
// together do not retry together.
type Backoff struct {
	Initial    time.Duration // default 100ms
	Max        time.Duration // default 10s
	Multiplier float64       // default 2
}

// DefaultBackoff is used for the zero fields of Options.Backoff.
var DefaultBackoff = Backoff{Initial: 100 * time.Millisecond, Max: 10 * time.Second, Multiplier: 2}

func (b Backoff) withDefaults() Backoff {
	if b.Initial == 0 {
		b.Initial = DefaultBackoff.Initial
	}
	if b.Max == 0 {
		b.Max = max(DefaultBackoff.Max, b.Initial)
	}
	if b.Multiplier == 0 {
		b.Multiplier = DefaultBackoff.Multiplier
	}
	return b
}

func (b Backoff) validate() error {
	switch {
	case b.Initial < 0:
		return fmt.Errorf("backoff: initial pause %v is negative", b.Initial)
	case b.Max < b.Initial:
		return fmt.Errorf("backoff: maximum pause %v is below the initial %v", b.Max, b.Initial)
	case b.Multiplier < 1:
		return fmt.Errorf("backoff: multiplier %v must be at least 1", b.Multiplier)
	}
	return nil
}

// Pause returns the un-jittered pause after the given number of failed
// attempts (1 for the pause after the first failure).
func (b Backoff) Pause(failed int) time.Duration {
	d := float64(b.Initial)
	for i := 1; i < failed && d < float64(b.Max); i++ {
		d *= b.Multiplier
	}
	return time.Duration(min(d, float64(b.Max)))
}

// jitter returns a pause in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d < 2 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// Retryable reports whether a failed publish attempt may succeed when sent
// again: the gRPC codes the Pub/Sub service documents as transient for
// Publish, the client's own publish timeout, and its flow-control limits.
// Anything else — an invalid message, a missing topic, a stopped
// publisher, missing permissions — fails the same way every time.
//
// Retrying is safe here in a way it is not for plain Publish: every
// attempt carries the same key, so a copy the server stored before the
// failure is a republish the dedup pipeline drops.
func Retryable(err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, pubsub.ErrFlowControllerMaxOutstandingMessages),
		errors.Is(err, pubsub.ErrFlowControllerMaxOutstandingBytes):
		return true
	case errors.Is(err, context.DeadlineExceeded):
		// Get's own context is checked before this is asked, so this is
		// the client's PublishSettings.Timeout running out.
		return true
	case errors.Is(err, context.Canceled):
		return false
	}
	s, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch s.Code() {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Unknown:
		return true
	case codes.Internal:
		// The client turns a non-UTF-8 string into Internal; sending it
		// again cannot help (Publish rejects such events up front anyway).
		return !strings.Contains(s.Message(), "invalid UTF-8")
	}
	return false
}

// PublishError is returned by Result.Get when an event was not published:
// its last attempt failed with an error that is not retryable, or every one
// of MaxAttempts attempts failed. A copy may still have been stored by an
// attempt whose response was lost; it carries Key, so publishing the event
// again later with the same key is safe.
type PublishError struct {
	Key         string // the event's key, as stamped on every attempt
	IDAttribute string
	// KeyAttribute is IDAttribute, under its former name.
	//
	// Deprecated: use IDAttribute.
	KeyAttribute string
	Topic        string
	Attempts     int
	// GaveUp is true when the last error was retryable and the attempts
	// ran out; false when it was not retryable.
	GaveUp bool
	Err    error // the last attempt's error
}

func (e *PublishError) Error() string {
	how := "gave up after"
	if !e.GaveUp {
		how = "not retryable, after"
	}
	n := "attempts"
	if e.Attempts == 1 {
		n = "attempt"
	}
	return fmt.Sprintf("publish event %s=%q to %s: %s %d %s: %v", e.IDAttribute, e.Key, e.Topic, how, e.Attempts, n, e.Err)
}

func (e *PublishError) Unwrap() error { return e.Err }
