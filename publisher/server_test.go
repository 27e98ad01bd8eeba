package publisher_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	vkit "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/pubsubio"
)

const project = "test-project"

var seq atomic.Int64

// lossyFront is a Pub/Sub server in front of a pstest server whose Publish
// stores the messages and then, for the first `lose` requests, answers
// Unavailable instead of the message IDs: the response lost after the
// server stored the message, which is what makes a retry a duplicate.
//
// pstest's reactors cannot act this out: a reactor runs under the server's
// lock and before the message is stored, so it can fail a request or let it
// through, not both; calling srv.Publish from inside one deadlocks.
type lossyFront struct {
	*pstest.GServer
	mu       sync.Mutex
	lose     int
	requests int
}

func (f *lossyFront) Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error) {
	resp, err := f.GServer.Publish(ctx, req)
	f.mu.Lock()
	defer f.mu.Unlock()
	f.requests++
	if err == nil && f.lose > 0 {
		f.lose--
		return nil, status.Error(codes.Unavailable, "test: response lost after the message was stored")
	}
	return resp, err
}

func (f *lossyFront) Requests() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests
}

// newLossy starts a pstest server and a lossy front for it, losing the
// responses of the first lose publish requests. Subscriptions and admin
// calls pass straight through.
func newLossy(t *testing.T, lose int) (*pstest.Server, *lossyFront, string) {
	t.Helper()
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	front := &lossyFront{GServer: &srv.GServer, lose: lose}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	pb.RegisterPublisherServer(g, front)
	pb.RegisterSubscriberServer(g, &srv.GServer)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = g.Serve(lis)
	}()
	t.Cleanup(func() {
		g.Stop()
		<-done
	})
	return srv, front, lis.Addr().String()
}

// never is a gax retryer that never retries.
type never struct{}

func (never) Retry(error) (time.Duration, bool) { return 0, false }

// newClient connects to addr. With clientRetries false the official
// client's own Publish retries are off, so every failed attempt reaches the
// publisher package and its retries are the ones under test.
func newClient(t *testing.T, addr string, clientRetries bool) *pubsub.Client {
	t.Helper()
	var cfg *pubsub.ClientConfig
	if !clientRetries {
		cfg = &pubsub.ClientConfig{TopicAdminCallOptions: &vkit.TopicAdminCallOptions{
			Publish: []gax.CallOption{gax.WithRetry(func() gax.Retryer { return never{} })},
		}}
	}
	c, err := pubsub.NewClientWithConfig(context.Background(), project, cfg, pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// newTopic creates a fresh topic and returns a publisher for it, stopped
// when the test ends.
func newTopic(t *testing.T, c *pubsub.Client) (pubsubio.Name, *pubsub.Publisher) {
	t.Helper()
	n := pubsubio.Name{Project: project, Kind: "topics", ID: fmt.Sprintf("topic-%d", seq.Add(1))}
	if err := pubsubio.EnsureTopic(context.Background(), c, n); err != nil {
		t.Fatal(err)
	}
	p := c.Publisher(n.String())
	// Send at once: tests publish one event at a time.
	p.PublishSettings.DelayThreshold = time.Millisecond
	t.Cleanup(p.Stop)
	return n, p
}

// stored returns the messages the server holds for topic, in publish order.
func stored(srv *pstest.Server, topic pubsubio.Name) []*pstest.Message {
	var out []*pstest.Message
	for _, m := range srv.Messages() {
		if m.Topic == topic.String() {
			out = append(out, m)
		}
	}
	return out
}

// sleeps records the pauses asked for instead of waiting them out.
type sleeps struct {
	mu sync.Mutex
	d  []time.Duration
}

func (s *sleeps) Sleep(ctx context.Context, d time.Duration) error {
	s.mu.Lock()
	s.d = append(s.d, d)
	s.mu.Unlock()
	return ctx.Err()
}

func (s *sleeps) get() []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Duration(nil), s.d...)
}
