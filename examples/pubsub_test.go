package examples

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
)

// client connects to the broker at addr.
func client(t testing.TB, project, addr string) *pubsub.Client {
	t.Helper()
	c, err := pubsubio.NewClient(context.Background(), project, pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// output collects what a pipeline writes, through a subscription of its
// output topic.
type output struct {
	mu      sync.Mutex
	msgs    []*pubsub.Message
	changed chan struct{} // closed and replaced on every message
	stop    func()        // ends the receive and waits for it, once
}

// collect receives from sub until stop or the test's end. A test that
// stops the server first calls stop: the official client's Receive never
// returns once its server is gone (googleapis/google-cloud-go#2217).
func collect(t testing.TB, c *pubsub.Client, sub string) *output {
	t.Helper()
	o := &output{changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- c.Subscriber(sub).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			o.mu.Lock()
			defer o.mu.Unlock()
			o.msgs = append(o.msgs, m)
			close(o.changed)
			o.changed = make(chan struct{})
		})
	}()
	o.stop = sync.OnceFunc(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("receive %s: %v", sub, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("receive %s: still running 30 s after its context ended", sub)
		}
	})
	t.Cleanup(o.stop)
	return o
}

// data lists the payloads received so far, sorted.
func (o *output) data() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	var d []string
	for _, m := range o.msgs {
		d = append(d, string(m.Data))
	}
	slices.Sort(d)
	return d
}

// find returns the first message with this payload, or nil.
func (o *output) find(data string) *pubsub.Message {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range o.msgs {
		if string(m.Data) == data {
			return m
		}
	}
	return nil
}

// wait returns the message with this payload once it arrives, failing
// after d.
func (o *output) wait(t testing.TB, what, data string, d time.Duration) *pubsub.Message {
	t.Helper()
	deadline := time.After(d)
	for {
		o.mu.Lock()
		changed := o.changed
		o.mu.Unlock()
		if m := o.find(data); m != nil {
			return m
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s: no %q after %s; received %q", what, data, d, o.data())
		}
	}
}

// count waits until n messages have arrived, failing after d.
func (o *output) count(t testing.TB, what string, n int, d time.Duration) {
	t.Helper()
	deadline := time.After(d)
	for {
		o.mu.Lock()
		changed, got := o.changed, len(o.msgs)
		o.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("%s: %d of %d messages after %s", what, got, n, d)
		}
	}
}
