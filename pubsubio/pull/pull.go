// Package pull is the pipeline's batch receive path: StreamingPull on the
// official low-level client (cloud.google.com/go/pubsub/v2/apiv1), handing
// a handler a batch of messages at a time and settling each message of it
// as the handler says, with one ack request and one nack request per batch.
//
// What it does that the high-level client's Receive did:
//
//   - flow control: max_outstanding_messages and _bytes on every stream
//     (the options split across the streams), and the same bounds in
//     process, across streams: a response waits for room before its
//     messages are taken;
//   - lease extension of every message in hand, in batched requests, every
//     half ack deadline;
//   - the stream keepalive of protocol_version 1: a ping (an empty request)
//     every 30 s, and a stream whose server has answered pings (with empty
//     responses) but answers nothing 15 s after one is reopened; a server
//     that never answers (before protocol_version 1) is not held to it;
//   - exactly-once subscriptions: an ack ID the server confirms as
//     temporarily failed is acked again on its own, after a pause that
//     doubles with each failure, up to 5 times; invalid ones are counted
//     (Stats, and Collector for Prometheus);
//   - reconnects with backoff on retryable codes, keeping the client ID;
//   - a clean stop: the batch being handled is finished and settled, the
//     messages not yet handed over are nacked.
//
// Each stream hands over one batch at a time and settles it before the
// next, so messages of one ordering key (which the service delivers on one
// stream) are handled in order, within and across batches.
package pull

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	apiv1 "cloud.google.com/go/pubsub/v2/apiv1"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// Result is what to do with one message of a batch: ack it, or nack it
// after NackAfter (its ack deadline is set to that instead of 0).
type Result struct {
	Ack       bool
	NackAfter time.Duration
}

// Handler decides a batch: it sets rs[i] for ms[i]. It must not keep ms.
type Handler func(ctx context.Context, ms []*pubsub.Message, rs []Result)

// Options configure a Receiver.
type Options struct {
	// Streams is how many StreamingPull streams to keep open; default 2.
	Streams int
	// MaxOutstanding and MaxOutstandingBytes bound the messages in hand
	// (received, not yet acked or nacked); defaults 1000 and 1 GB.
	MaxOutstanding      int
	MaxOutstandingBytes int64
	// MaxBatch is the most messages handed over at once; default 1000.
	MaxBatch int
	// BatchWait bounds how long a message waits for its batch to fill
	// while the stream is idle; 0 hands over at once what has arrived
	// (messages still gather while a batch is in work).
	BatchWait time.Duration
	// AckDeadline is the stream's ack deadline, which leases are extended
	// by; default 60 s (10 s to 600 s).
	AckDeadline time.Duration
	Logger      *slog.Logger

	// Keepalive timing; zero means the protocol's 30 s and 15 s.
	pingEvery, serverTimeout time.Duration
}

func (o *Options) defaults() error {
	if o.Streams <= 0 {
		o.Streams = 2
	}
	if o.MaxOutstanding <= 0 {
		o.MaxOutstanding = 1000
	}
	if o.MaxOutstandingBytes <= 0 {
		o.MaxOutstandingBytes = 1e9
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = 1000
	}
	if o.BatchWait < 0 {
		return fmt.Errorf("batch wait %v: want 0 or more", o.BatchWait)
	}
	if o.AckDeadline == 0 {
		o.AckDeadline = time.Minute
	}
	if o.AckDeadline < 10*time.Second || o.AckDeadline > 600*time.Second {
		return fmt.Errorf("ack deadline %v: want 10s to 600s", o.AckDeadline)
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.pingEvery <= 0 {
		o.pingEvery = 30 * time.Second
	}
	if o.serverTimeout <= 0 {
		o.serverTimeout = 15 * time.Second
	}
	return nil
}

// Stats are a Receiver's counters.
type Stats struct {
	Streams     int64 // streams opened, reconnects included
	Received    int64
	Acked       int64
	Nacked      int64
	InvalidAcks int64 // ack IDs the server confirmed as invalid (exactly-once)
}

// Receiver receives from one subscription.
type Receiver struct {
	sac       *apiv1.SubscriptionAdminClient
	sub       string
	opt       Options
	msgs      *semaphore.Weighted
	bytes     *semaphore.Weighted
	clientID  string
	streams   atomic.Int64
	received  atomic.Int64
	acked     atomic.Int64
	nacked    atomic.Int64
	invalid   atomic.Int64
	receiving atomic.Bool
}

// New returns a Receiver of subscription sub (projects/P/subscriptions/S)
// through sac, the client's SubscriptionAdminClient.
func New(sac *apiv1.SubscriptionAdminClient, sub string, opt Options) (*Receiver, error) {
	if sac == nil {
		return nil, errors.New("pull: no SubscriptionAdminClient (the client's, as in client.SubscriptionAdminClient)")
	}
	if !strings.HasPrefix(sub, "projects/") {
		return nil, fmt.Errorf("pull: subscription %q: want its full name, projects/P/subscriptions/S", sub)
	}
	if _, err := pubsubio.SubscriptionName("", sub); err != nil {
		return nil, fmt.Errorf("pull: %w", err)
	}
	if err := opt.defaults(); err != nil {
		return nil, err
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	return &Receiver{sac: sac, sub: sub, opt: opt,
		msgs: semaphore.NewWeighted(int64(opt.MaxOutstanding)), bytes: semaphore.NewWeighted(opt.MaxOutstandingBytes),
		clientID: "dedupflow-" + hex.EncodeToString(id)}, nil
}

// Stats returns the counters so far.
func (r *Receiver) Stats() Stats {
	return Stats{Streams: r.streams.Load(), Received: r.received.Load(), Acked: r.acked.Load(),
		Nacked: r.nacked.Load(), InvalidAcks: r.invalid.Load()}
}

// Receive runs the streams until ctx ends (then it returns nil once every
// stream has settled what it held) or a stream meets an error that
// retrying cannot fix (then it stops the others and returns it).
func (r *Receiver) Receive(ctx context.Context, h Handler) error {
	if r.receiving.Swap(true) {
		return errors.New("receiver already receiving")
	}
	defer r.receiving.Store(false)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	for range r.opt.Streams {
		wg.Go(func() {
			if err := r.stream(ctx, h); err != nil {
				once.Do(func() { failed = err })
				cancel(err)
			}
		})
	}
	wg.Wait()
	return failed
}

// stream keeps one stream open, reopening it with backoff after a
// retryable error.
func (r *Receiver) stream(ctx context.Context, h Handler) error {
	for n := 1; ; n++ {
		got, err := r.session(ctx, h)
		if ctx.Err() != nil {
			return nil
		}
		if !retryable(err) {
			return fmt.Errorf("streaming pull %s: %w", r.sub, err)
		}
		if got {
			n = 1 // a stream that delivered was healthy: start the backoff again
		}
		r.opt.Logger.Debug("streaming pull broke; reopening", "subscription", r.sub, "err", err)
		if backoff.Sleep(ctx, backoff.Delay(n, 100*time.Millisecond, 10*time.Second)) != nil {
			return nil
		}
	}
}

// retryable reports whether a stream that ended with err is worth
// reopening, as the official client's default retryer decides.
func retryable(err error) bool {
	if errors.Is(err, errSilent) {
		return true
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Internal, codes.ResourceExhausted, codes.Aborted, codes.Unavailable, codes.Unknown, codes.Canceled:
		return true
	}
	return false
}

// errSilent: the server answered nothing within the timeout after a ping.
var errSilent = errors.New("no response to a keepalive ping")
