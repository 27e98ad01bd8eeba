// Command relayfloor is the least work a dedup relay on the official Go
// client can do, the bench's floor for CPU per message: Receive, an
// in-memory seen-map, Publish, Ack once the publish is confirmed. With
// --receiver batch it receives instead through pubsubio/pull (StreamingPull
// on the low-level API, a batch at a time, as the pipeline's default
// receiver) and publishes each batch's first copies in one Publish RPC
// before the batch is acked: the floor of the pipeline's own batch path. With
// --publish batched (the default) it publishes through the client's Publish
// RPC in batches of up to 1000 (sink/topic, the pipeline's own output, so
// the two differ only in what dedup costs); with --publish client through
// the client's Publisher (its bundler, flow control and per-message
// results), which costs more per message. It has
// no claim/commit protocol and is not crash-safe (a key is marked seen
// before its output is written, so a failed publish loses the message and
// a restart forgets every key); it only exists to be measured against.
//
//	PUBSUB_EMULATOR_HOST=127.0.0.1:8085 relayfloor --project P --subscription S --topic T --key key
//
// It stops on SIGTERM or SIGINT, after the last acks are sent, and then
// logs one JSON line with its counters.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/pubsubio/pull"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/topic"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "relayfloor:", err)
		os.Exit(1)
	}
}

// counts are the relay's own counters, logged when it stops.
type counts struct {
	Msg      string `json:"msg"`
	Received int64  `json:"received"`
	Emitted  int64  `json:"emitted"`
	Dropped  int64  `json:"dropped"`
	Failed   int64  `json:"failed"`
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("relayfloor", flag.ContinueOnError)
	project := fs.String("project", "", "project of the subscription and the topic")
	subID := fs.String("subscription", "", "input subscription ID")
	topicID := fs.String("topic", "", "output topic ID")
	key := fs.String("key", "key", "attribute holding the dedup key")
	outstanding := fs.Int("max-outstanding", 4000, "messages held at once (as the pipeline's default)")
	mode := fs.String("publish", "batched", "batched: the Publish RPC in batches (sink/topic); client: the client's Publisher")
	receiver := fs.String("receiver", "client", "client: the client's Receive, a message at a time; batch: pubsubio/pull, a batch at a time (with --publish batched)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *project == "" || *subID == "" || *topicID == "" {
		return fmt.Errorf("--project, --subscription and --topic are required")
	}
	switch {
	case *receiver != "client" && *receiver != "batch":
		return fmt.Errorf("--receiver %q: want client or batch", *receiver)
	case *receiver == "batch" && *mode != "batched":
		return fmt.Errorf("--receiver batch publishes each batch in one request: it needs --publish batched, not %q", *mode)
	}
	c, err := pubsub.NewClient(ctx, *project)
	if err != nil {
		return fmt.Errorf("connect to pubsub: %w", err)
	}
	defer c.Close()
	var publish func(ctx context.Context, m *pubsub.Message) error
	var out *topic.Sink
	switch *mode {
	case "batched":
		out = topic.New(c, pubsubio.Name{Project: *project, Kind: "topics", ID: *topicID}, time.Minute)
		defer out.Stop()
		publish = func(ctx context.Context, m *pubsub.Message) error {
			return out.Write(ctx, &sink.Message{Data: m.Data, Attributes: m.Attributes})
		}
	case "client":
		pub := c.Publisher(*topicID)
		// The pipeline's topic sink sends up to 1000 messages per
		// request; the same batch size keeps the comparison about dedup.
		pub.PublishSettings.CountThreshold = 1000
		pub.PublishSettings.ByteThreshold = 9 << 20
		pub.PublishSettings.FlowControlSettings.MaxOutstandingMessages = 2 * *outstanding
		defer pub.Stop()
		publish = func(ctx context.Context, m *pubsub.Message) error {
			_, err := pub.Publish(ctx, &pubsub.Message{Data: m.Data, Attributes: m.Attributes}).Get(ctx)
			return err
		}
	default:
		return fmt.Errorf("--publish %q: want batched or client", *mode)
	}

	r := &relay{key: *key, seen: map[string]struct{}{}}
	// Publishes outlive the Receive context, so that a message taken in
	// before SIGTERM is still written and acked.
	pubCtx := context.WithoutCancel(ctx)
	if *receiver == "batch" {
		in, perr := pull.New(c.SubscriptionAdminClient, pubsubio.Name{Project: *project, Kind: "subscriptions", ID: *subID}.String(),
			pull.Options{Streams: 2, MaxOutstanding: *outstanding})
		if perr != nil {
			return perr
		}
		err = in.Receive(ctx, func(_ context.Context, ms []*pubsub.Message, rs []pull.Result) { r.batch(pubCtx, out, ms, rs) })
	} else {
		sub := c.Subscriber(*subID)
		sub.ReceiveSettings.NumGoroutines = 2
		sub.ReceiveSettings.MaxOutstandingMessages = *outstanding
		err = sub.Receive(ctx, func(_ context.Context, m *pubsub.Message) { r.one(pubCtx, publish, m) })
	}
	line, _ := json.Marshal(counts{Msg: "relay stopped", Received: r.received.Load(), Emitted: r.emitted.Load(),
		Dropped: r.dups.Load(), Failed: r.failed.Load()})
	fmt.Fprintln(os.Stderr, string(line))
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("receive: %w", err)
	}
	return nil
}

// relay is the seen-map and the counters, shared by both receivers.
type relay struct {
	key                             string
	mu                              sync.Mutex
	seen                            map[string]struct{}
	received, emitted, dups, failed atomic.Int64
}

// first marks m's key seen and says whether it was new.
func (r *relay) first(m *pubsub.Message) bool {
	r.received.Add(1)
	k := m.Attributes[r.key]
	if k == "" {
		k = m.ID
	}
	r.mu.Lock()
	_, dup := r.seen[k]
	if !dup {
		r.seen[k] = struct{}{}
	}
	r.mu.Unlock()
	if dup {
		r.dups.Add(1)
	}
	return !dup
}

// one relays a message of the client's Receive.
func (r *relay) one(ctx context.Context, publish func(context.Context, *pubsub.Message) error, m *pubsub.Message) {
	if !r.first(m) {
		m.Ack()
		return
	}
	if err := publish(ctx, m); err != nil {
		r.failed.Add(1)
		m.Nack() // it comes back, and is then taken for a duplicate: the floor is not crash-safe
		return
	}
	r.emitted.Add(1)
	m.Ack()
}

// batch relays a batch of the batch receiver: its first copies go out in
// one publish request, and the receiver acks the batch once it returns.
func (r *relay) batch(ctx context.Context, out *topic.Sink, ms []*pubsub.Message, rs []pull.Result) {
	var news []*sink.Message
	var at []int
	for i, m := range ms {
		rs[i].Ack = true
		if r.first(m) {
			news = append(news, &sink.Message{Data: m.Data, Attributes: m.Attributes})
			at = append(at, i)
		}
	}
	if len(news) == 0 {
		return
	}
	errs := make([]error, len(news))
	out.WriteBatch(ctx, news, errs)
	for j, err := range errs {
		if err != nil {
			r.failed.Add(1)
			rs[at[j]].Ack = false // nacked now; it comes back as a duplicate, as in one
			continue
		}
		r.emitted.Add(1)
	}
}
