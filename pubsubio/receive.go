package pubsubio

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
)

// Receiver is what reads a subscription: a *pubsub.Subscriber.
type Receiver interface {
	Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error
}

// StopWithin wraps r so that its Receive returns at most grace after its
// context ended and every callback it started returned. The official
// client keeps reconnecting to a server it cannot reach even after the
// context is cancelled, and its Receive then never returns
// (googleapis/google-cloud-go#2217): without this a SIGTERM or Ctrl-C
// during an outage would hang the process. Callbacks are waited for in
// full, since their work is bounded and cutting it short would leave it
// half done; grace is for the client's last acks. Past it, Receive
// returns an error saying so; the client's goroutines stay behind, blocked
// on the connection, for the process to exit past them. Messages whose
// acks were not sent are redelivered.
func StopWithin(r Receiver, grace time.Duration) Receiver { return stopWithin{r, grace} }

type stopWithin struct {
	r     Receiver
	grace time.Duration
}

func (s stopWithin) Receive(ctx context.Context, f func(context.Context, *pubsub.Message)) error {
	var busy atomic.Int64
	idle := make(chan struct{}, 1) // a callback ended and none runs
	done := make(chan error, 1)
	go func() {
		done <- s.r.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
			busy.Add(1)
			defer func() {
				if busy.Add(-1) == 0 {
					select {
					case idle <- struct{}{}:
					default:
					}
				}
			}()
			f(ctx, m)
		})
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	for busy.Load() > 0 {
		select {
		case err := <-done:
			return err
		case <-idle:
		}
	}
	t := time.NewTimer(s.grace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("stopped without the Pub/Sub client, which did not stop within %v of the last message's end: the server is unreachable; messages not acknowledged yet will be delivered again", s.grace)
	}
}
