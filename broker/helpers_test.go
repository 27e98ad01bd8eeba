package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

const project = "dedupflow-test"

// fakeClock is an injectable clock that tests move forward by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{t: time.Now()} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func testLogger(t testing.TB) *slog.Logger {
	if os.Getenv("BROKER_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}

// target is one server the behaviour suite runs against.
type target struct {
	name  string
	addr  string
	ours  *Broker    // nil for the references
	clock *fakeClock // ours only: lets a test skip waiting for deadlines
}

// sleep waits d of server time: instantly for ours (the fake clock moves,
// and what came due fires now, as the broker's timer loop would within
// 100ms), for real on the references.
func (tg target) sleep(d time.Duration) {
	if tg.clock != nil {
		tg.clock.Advance(d)
		b := tg.ours
		b.mu.Lock()
		b.fireTimersLocked(b.nowNanos())
		b.mu.Unlock()
		return
	}
	time.Sleep(d)
}

func startOurs(t testing.TB, opts Options) target {
	t.Helper()
	clock := newFakeClock()
	if opts.Now == nil {
		opts.Now = clock.Now
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	addr, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close broker: %v", err)
		}
	})
	return target{name: "ours", addr: addr, ours: b, clock: clock}
}

func startPstest(t testing.TB) target {
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	return target{name: "pstest", addr: srv.Addr}
}

func emulator(t testing.TB) target {
	return target{name: "emulator", addr: testenv.EmulatorHost(t)}
}

// forEachTarget runs f against our broker and every reference in refs
// ("emulator", "pstest"), in parallel subtests.
func forEachTarget(t *testing.T, refs []string, f func(t *testing.T, tg target)) {
	forEachTargetWith(t, Options{}, refs, f)
}

// forEachTargetWith is forEachTarget with our broker started with opts.
func forEachTargetWith(t *testing.T, opts Options, refs []string, f func(t *testing.T, tg target)) {
	t.Run("ours", func(t *testing.T) {
		t.Parallel()
		f(t, startOurs(t, opts))
	})
	for _, r := range refs {
		t.Run(r, func(t *testing.T) {
			t.Parallel()
			switch r {
			case "emulator":
				f(t, emulator(t))
			case "pstest":
				f(t, startPstest(t))
			default:
				t.Fatalf("unknown reference %q", r)
			}
		})
	}
}

func newClient(t testing.TB, addr string) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project,
		option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var nameSeq atomic.Int64

// unique returns a resource ID that no other test (or test process sharing
// the emulator) uses.
func unique(prefix string) string {
	return fmt.Sprintf("%s-%d-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%1e9, nameSeq.Add(1))
}

func topicName(id string) string { return "projects/" + project + "/topics/" + id }
func subName(id string) string   { return "projects/" + project + "/subscriptions/" + id }

func createTopic(t testing.TB, c *pubsub.Client) string {
	t.Helper()
	tp, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topicName(unique("t"))})
	if err != nil {
		t.Fatal(err)
	}
	return tp.Name
}

func createSub(t testing.TB, c *pubsub.Client, sp *pb.Subscription) *pb.Subscription {
	t.Helper()
	if sp.Name == "" {
		sp.Name = subName(unique("s"))
	}
	if sp.AckDeadlineSeconds == 0 {
		sp.AckDeadlineSeconds = 10 // pstest rejects 0
	}
	s, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), sp)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func publish(t testing.TB, c *pubsub.Client, topic string, msgs ...*pubsub.Message) []string {
	t.Helper()
	ctx := context.Background()
	p := c.Publisher(topic)
	defer p.Stop()
	var res []*pubsub.PublishResult
	for _, m := range msgs {
		res = append(res, p.Publish(ctx, m))
	}
	var ids []string
	for _, r := range res {
		id, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// pullOne pulls with unary Pull until a message arrives or timeout passes.
func pullOne(t testing.TB, c *pubsub.Client, sub string, timeout time.Duration) *pb.ReceivedMessage {
	t.Helper()
	end := time.Now().Add(timeout)
	for time.Now().Before(end) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		r, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 1, ReturnImmediately: true}) //nolint:staticcheck
		cancel()
		if err == nil && len(r.ReceivedMessages) > 0 {
			return r.ReceivedMessages[0]
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no message on %s within %v", sub, timeout)
	return nil
}

// seekTo seeks sub to the time at.
func seekTo(t testing.TB, c *pubsub.Client, sub string, at time.Time) {
	t.Helper()
	if _, err := c.SubscriptionAdminClient.Seek(context.Background(), &pb.SeekRequest{Subscription: sub,
		Target: &pb.SeekRequest_Time{Time: timestamppb.New(at)}}); err != nil {
		t.Fatalf("seek %s to %v: %v", sub, at, err)
	}
}

// pullNone fails the test, saying after what, when a pull that returns at
// once (within 2 s) gets a message from sub.
func pullNone(t testing.TB, c *pubsub.Client, sub, after string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	r, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
	if err == nil && len(r.ReceivedMessages) > 0 {
		t.Errorf("after %s got %d messages, want none", after, len(r.ReceivedMessages))
	}
}
