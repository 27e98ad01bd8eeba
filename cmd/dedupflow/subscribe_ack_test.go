package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/option"
	"google.golang.org/grpc"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// ackSub makes a topic and a subscription of their own on the server at
// host (Google's emulator is shared by the tests), with a 10 s ack
// deadline, publishes n messages and returns the subscription.
func ackSub(t *testing.T, host string, n int) (*pubsub.Client, pubsubio.Name) {
	t.Helper()
	ctx := context.Background()
	c := brokertest.Dial(t, host, "p")
	var b [4]byte
	_, _ = rand.Read(b[:])
	topic := pubsubio.Name{Project: "p", Kind: "topics", ID: "acks-" + hex.EncodeToString(b[:])}
	sub := pubsubio.Name{Project: "p", Kind: "subscriptions", ID: topic.ID + "-sub"}
	if err := pubsubio.EnsureTopic(ctx, c, topic); err != nil {
		t.Fatal(err)
	}
	if err := pubsubio.EnsureSubscription(ctx, c, sub, topic, 10); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(topic.String())
	defer pub.Stop()
	var rs []*pubsub.PublishResult
	for i := range n {
		rs = append(rs, pub.Publish(ctx, &pubsub.Message{Data: []byte{'a' + byte(i%26)}}))
	}
	for _, r := range rs {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return c, sub
}

// TestSubscribeCountWaitsForAcks: subscribe --count returns only once the
// server has answered the acks of what it printed. Here each Acknowledge
// call takes 300 ms longer, so a subscribe that returned without waiting
// for its acks (and whose process then exited, losing them) is seen every
// time, not only when a loaded scheduler happens to run the exit first.
func TestSubscribeCountWaitsForAcks(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		_, sub := ackSub(t, host, 3)
		var acked atomic.Int64
		slowAcks := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoke grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			if !strings.HasSuffix(method, "/Acknowledge") {
				return invoke(ctx, method, req, reply, cc, opts...)
			}
			// The window under test: an ack that takes a while to reach the server.
			time.Sleep(300 * time.Millisecond)
			err := invoke(ctx, method, req, reply, cc, opts...)
			if err == nil {
				acked.Add(int64(len(req.(interface{ GetAckIds() []string }).GetAckIds())))
			}
			return err
		})
		ctx := context.Background()
		c, err := pubsub.NewClient(ctx, "p", append(pubsubio.Insecure(host), option.WithGRPCDialOption(slowAcks))...)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		var out bytes.Buffer
		if err := subscribe(ctx, c.SubscriptionAdminClient, sub.String(), &out, false, 2); err != nil {
			t.Fatal(err)
		}
		if n := acked.Load(); n != 2 {
			t.Errorf("subscribe --count 2 returned with %d of its 2 acks answered by the server; printed:\n%s", n, &out)
		}
	})
}

// TestSubscribeCountUnderLoad runs the built binary's subscribe --count 2
// again and again, on one CPU (GOMAXPROCS=1) of a machine kept busy, until
// every message was printed, as the tutorial's reader does: none may be
// printed twice, and none may be left unacknowledged.
func TestSubscribeCountUnderLoad(t *testing.T) {
	bin := buildBinary(t, false)
	testenv.EmulatorAndOurs(t, brokertest.Ours, func(t *testing.T, host string) {
		const n = 24
		c, sub := ackSub(t, host, n)
		stopLoad := burnCPU()
		defer stopLoad()
		printed := map[string]bool{}
		for run := 0; len(printed) < n; run++ {
			// Only a lost ack keeps a run waiting, for its message to
			// come back a minute later.
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			cmd := exec.CommandContext(ctx, bin, "subscribe", "--subscription", sub.String(), "--count", "2", "--json")
			cmd.Env = append(os.Environ(), "PUBSUB_EMULATOR_HOST="+host, "GOMAXPROCS=1")
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			cancel()
			if err != nil {
				t.Fatalf("run %d of subscribe --count 2: %v\n%s", run+1, err, &stderr)
			}
			for sc := bufio.NewScanner(bytes.NewReader(out)); sc.Scan(); {
				var m received
				if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
					t.Fatalf("line %q: %v", sc.Text(), err)
				}
				if printed[m.MessageID] {
					t.Fatalf("run %d of subscribe --count 2 printed message %s again, after %d of the %d messages: an earlier run's ack was lost", run+1, m.MessageID, len(printed), n)
				}
				printed[m.MessageID] = true
			}
		}
		stopLoad()
		// A lost ack shows when its message is delivered again, which
		// the lease the client took puts a minute away; a seek to a
		// snapshot taken now brings back at once every message not
		// acknowledged.
		ctx := context.Background()
		snap := "projects/p/snapshots/" + sub.ID
		if _, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snap, Subscription: sub.String()}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: sub.String(), Target: &pb.SeekRequest_Snapshot{Snapshot: snap}}); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		var (
			mu   sync.Mutex
			back []string
		)
		_ = c.Subscriber(sub.String()).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			mu.Lock()
			defer mu.Unlock()
			back = append(back, m.ID)
		})
		if len(back) > 0 {
			t.Errorf("%d of the %d messages subscribe printed were not acknowledged: %v", len(back), n, back)
		}
	})
}

// burnCPU keeps twice as many goroutines as CPUs spinning until the
// returned stop, so the commands under test run on a busy machine.
func burnCPU() (stop func()) {
	var (
		done atomic.Bool
		wg   sync.WaitGroup
	)
	for range 2 * runtime.NumCPU() {
		wg.Go(func() {
			for x := 0; !done.Load(); x++ {
				_ = x * x
			}
		})
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			done.Store(true)
			wg.Wait()
		})
	}
}
