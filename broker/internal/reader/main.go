// Command reader is the reading client of the broker package's
// BenchmarkReadingClient: the official Go client receiving and acking a
// subscription's backlog in a process of its own, so that the benchmark
// can read the client's CPU time apart from the broker's.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
)

func main() {
	addr := flag.String("addr", "", "broker host:port")
	sub := flag.String("sub", "", "subscription resource name")
	n := flag.Int("n", 0, "distinct messages to receive before stopping")
	streams := flag.Int("streams", 2, "streaming pulls (ReceiveSettings.NumGoroutines)")
	outstanding := flag.Int("outstanding", 4000, "ReceiveSettings.MaxOutstandingMessages")
	flag.Parse()
	if err := run(context.Background(), *addr, *sub, *n, *streams, *outstanding); err != nil {
		fmt.Fprintln(os.Stderr, "reader:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, sub string, n, streams, outstanding int) error {
	c, err := pubsub.NewClient(ctx, "reader", pubsubio.Insecure(addr)...)
	if err != nil {
		return err
	}
	defer c.Close()
	s := c.Subscriber(sub)
	s.ReceiveSettings.NumGoroutines = streams
	s.ReceiveSettings.MaxOutstandingMessages = outstanding
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var mu sync.Mutex
	seen := make(map[string]bool, n)
	err = s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		mu.Lock()
		seen[m.ID] = true
		if len(seen) == n {
			cancel()
		}
		mu.Unlock()
	})
	if err != nil {
		return err
	}
	if len(seen) < n {
		return fmt.Errorf("received %d of %d messages", len(seen), n)
	}
	return nil
}
