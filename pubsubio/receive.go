package pubsubio

import (
	"context"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
)

// Receiver is what reads a subscription: a *pubsub.Subscriber.
type Receiver interface {
	Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error
}

// StopWithin wraps r so that its Receive returns at most grace after its
// context ends. The official client keeps reconnecting to a server it
// cannot reach even after the context is cancelled, and its Receive then
// never returns (googleapis/google-cloud-go#2217): without this a SIGTERM
// or Ctrl-C during an outage would hang the process. Past grace, Receive
// returns an error saying so; the client's goroutines stay behind, blocked
// on the connection or in callbacks that have not returned yet, for the
// process to exit past them. Messages whose acks were not sent are
// redelivered.
func StopWithin(r Receiver, grace time.Duration) Receiver { return stopWithin{r, grace} }

type stopWithin struct {
	r     Receiver
	grace time.Duration
}

func (s stopWithin) Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error {
	done := make(chan error, 1)
	go func() { done <- s.r.Receive(ctx, f) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	t := time.NewTimer(s.grace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		// The client also waits for callbacks still running: the server
		// is the likely cause, not a certain one.
		return fmt.Errorf("stopped without the Pub/Sub client, which did not stop within %v: the server is unreachable, or a message is still being processed; messages not acknowledged yet will be delivered again", s.grace)
	}
}
