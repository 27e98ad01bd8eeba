package pubsubio

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
)

// stuck is a Receiver like the official client during an outage: its
// Receive does not return after its context ends, until released.
type stuck struct{ release chan struct{} }

func (s stuck) Receive(ctx context.Context, _ func(context.Context, *pubsub.Message)) error {
	<-s.release
	return ctx.Err()
}

type returns struct{ err error }

func (r returns) Receive(context.Context, func(context.Context, *pubsub.Message)) error { return r.err }

// TestStopWithin: a Receive that does not end after its context does is
// left behind after the grace, with an error that says so; one that ends
// gives its own result, stopped or not.
func TestStopWithin(t *testing.T) {
	s := stuck{release: make(chan struct{})}
	defer close(s.release)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := StopWithin(s, 10*time.Millisecond).Receive(ctx, nil)
	if err == nil || !strings.Contains(err.Error(), "did not stop within 10ms") {
		t.Errorf("a Receive that hangs after the stop: %v, want an error naming the grace", err)
	}

	failed := errors.New("permission denied")
	if err := StopWithin(returns{failed}, time.Hour).Receive(context.Background(), nil); !errors.Is(err, failed) {
		t.Errorf("a Receive that fails by itself: %v, want its error", err)
	}
	if err := StopWithin(returns{nil}, time.Hour).Receive(ctx, nil); err != nil {
		t.Errorf("a Receive that stops in time: %v, want nil", err)
	}
}

// slowThenStuck delivers one message whose callback runs until released,
// then hangs like stuck.
type slowThenStuck struct{ started, release chan struct{} }

func (s slowThenStuck) Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error {
	go f(ctx, &pubsub.Message{ID: "1"})
	<-s.release
	return ctx.Err()
}

// TestStopWithinWaitsForCallbacks: a message still being processed at the
// stop is waited for, however long it takes; the grace starts after it.
func TestStopWithinWaitsForCallbacks(t *testing.T) {
	s := slowThenStuck{started: make(chan struct{}), release: make(chan struct{})}
	defer close(s.release)
	finish := make(chan struct{})
	var finished atomic.Bool
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- StopWithin(s, 10*time.Millisecond).Receive(ctx, func(context.Context, *pubsub.Message) {
			close(s.started)
			<-finish
			finished.Store(true)
		})
	}()
	<-s.started
	cancel()
	select {
	case err := <-errc:
		t.Fatalf("Receive returned while a callback still ran: %v", err)
	case <-time.After(50 * time.Millisecond): // five graces: long enough to have cut it short
	}
	close(finish)
	err := <-errc
	if !finished.Load() || err == nil || !strings.Contains(err.Error(), "did not stop within 10ms") {
		t.Errorf("after the callback ended: finished %v, %v; want the grace's error", finished.Load(), err)
	}
}
