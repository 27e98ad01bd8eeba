package pipeline_test

import (
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
)

// reactor lets a test intercept one pstest call.
type reactor func(req any) (handled bool, ret any, err error)

func (f reactor) React(req any) (bool, any, error) { return f(req) }

// A lost ack: the message's deadline expires, Pub/Sub hands out the same
// message ID again, and the pipeline counts a redelivery and emits nothing.
func TestRedeliveryAfterAckDeadline(t *testing.T) {
	var inSub atomic.Value
	inSub.Store("")
	var dropped atomic.Int32
	loseFirstAck := pstest.ServerReactorOption{FuncName: "Acknowledge", Reactor: reactor(func(req any) (bool, any, error) {
		r := req.(*pubsubpb.AcknowledgeRequest)
		if r.Subscription == inSub.Load().(string) && dropped.CompareAndSwap(0, 1) {
			return true, &emptypb.Empty{}, nil // the ack is lost on the way
		}
		return false, nil, nil
	})}
	srv, conn := newPstest(t, loseFirstAck)
	var mu sync.Mutex
	skew := time.Duration(0)
	srv.SetTimeNowFunc(func() time.Time { mu.Lock(); defer mu.Unlock(); return time.Now().Add(skew) })

	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
	inSub.Store(r.inSub.String())
	r.start()
	id := r.publish("Message 1", map[string]string{"key": "123"})
	r.waitCounts("first delivery", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	for deadline := time.Now().Add(10 * time.Second); dropped.Load() != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first ack never reached the server")
		}
	}
	mu.Lock()
	skew = 11 * time.Second // past the 10 s ack deadline
	mu.Unlock()
	c := r.waitCounts("redelivery", func(c pipeline.Counts) bool { return c.DuplicateRedelivery == 1 })
	if m := srv.Message(id); m == nil || m.Deliveries < 2 {
		t.Fatalf("message %s was not delivered twice: %+v", id, m)
	}
	out := r.drain(r.outSub, 1, 300*time.Millisecond)
	if len(out) != 1 || c.Emitted != 1 || c.DuplicateRepublish != 0 {
		t.Fatalf("output %q, counts %+v; want one output and one redelivery", datas(out), c)
	}
}

// The output topic refuses writes for a while: the key is released, the
// input nacked, and after recovery the message is emitted exactly once.
func TestSinkFailureReleasesAndRecovers(t *testing.T) {
	var outTopic atomic.Value
	outTopic.Store("")
	var failures atomic.Int32
	failures.Store(3)
	failOutput := pstest.ServerReactorOption{FuncName: "Publish", Reactor: reactor(func(req any) (bool, any, error) {
		r := req.(*pubsubpb.PublishRequest)
		if r.Topic == outTopic.Load().(string) && failures.Add(-1) >= 0 {
			return true, nil, status.Error(codes.PermissionDenied, "injected: output topic refuses writes")
		}
		return false, nil, nil
	})}
	_, conn := newPstest(t, failOutput)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
	outTopic.Store(r.out.String())
	r.start()
	r.publish("Message 1", map[string]string{"key": "123"})
	c := r.waitCounts("emitted after recovery", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	if c.Retried < 3 {
		t.Errorf("retried %d times, want at least the 3 injected failures", c.Retried)
	}
	out := r.drain(r.outSub, 1, 500*time.Millisecond)
	if len(out) != 1 || out[0].data != "Message 1" {
		t.Fatalf("output %q, want Message 1 exactly once", datas(out))
	}
	if !r.p.Ready() {
		t.Error("pipeline not ready after the sink recovered")
	}
}

// A copy that arrives after the horizon passes through; one inside it
// does not.
func TestHorizon(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	_, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", Horizon: time.Minute}}, now: clock})
	r.start()
	r.publish("first", map[string]string{"key": "k"})
	r.waitCounts("first", func(c pipeline.Counts) bool { return c.Emitted == 1 })
	mu.Lock()
	now = now.Add(59 * time.Second)
	mu.Unlock()
	r.publish("inside", map[string]string{"key": "k"})
	r.waitCounts("inside", func(c pipeline.Counts) bool { return c.DuplicateRepublish == 1 })
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	r.publish("after", map[string]string{"key": "k"})
	r.waitCounts("after", func(c pipeline.Counts) bool { return c.Emitted == 2 })
	out := r.drain(r.outSub, 2, 300*time.Millisecond)
	if d := strings.Join(datas(out), ","); d != "after,first" {
		t.Fatalf("output %s, want after,first", d)
	}
}

func TestMissingIDPolicies(t *testing.T) {
	cases := []struct {
		policy  dedup.Missing
		emitted int64
		dead    int64
	}{
		{dedup.Fallback, 2, 0}, // two messages, two message IDs
		{dedup.Pass, 2, 0},
		{dedup.Reject, 0, 2},
	}
	for _, c := range cases {
		t.Run(c.policy.String(), func(t *testing.T) {
			_, conn := newPstest(t)
			r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", Missing: c.policy, ProducerAttribute: "source"}}, deadLetter: true})
			r.start()
			ids := map[string]bool{}
			for i := 0; i < 2; i++ {
				ids[r.publish("no key", map[string]string{"source": "billing"})] = true
			}
			got := r.waitCounts("both", func(n pipeline.Counts) bool { return n.Emitted+n.DeadLettered == 2 })
			if got.Emitted != c.emitted || got.DeadLettered != c.dead || got.MissingID != 2 {
				t.Fatalf("counts %+v, want emitted %d, dead-lettered %d, missing 2", got, c.emitted, c.dead)
			}
			switch c.policy {
			case dedup.Fallback:
				for _, m := range r.drain(r.outSub, 2, 200*time.Millisecond) {
					if !ids[strings.TrimPrefix(m.attrs["key"], dedup.MessageIDPrefix)] || !strings.HasPrefix(m.attrs["key"], dedup.MessageIDPrefix) {
						t.Errorf("fallback output key %q is not the message ID in its namespace", m.attrs["key"])
					}
				}
			case dedup.Pass:
				for _, m := range r.drain(r.outSub, 2, 200*time.Millisecond) {
					if _, ok := m.attrs["key"]; ok {
						t.Errorf("passed message got a key attribute: %v", m.attrs)
					}
				}
			case dedup.Reject:
				for _, m := range r.drain(r.dlSub, 2, 200*time.Millisecond) {
					if !strings.Contains(m.attrs[pipeline.AttrError], "id attribute missing") || !ids[m.attrs[pipeline.AttrSourceMessageID]] {
						t.Errorf("dead letter attributes %v lack the reason or source ID", m.attrs)
					}
				}
			}
		})
	}
}

func TestGarbledTimestamp(t *testing.T) {
	t.Run("to the dead-letter topic", func(t *testing.T) {
		_, conn := newPstest(t)
		r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key", TimestampAttribute: "occurred_at"}}, deadLetter: true})
		r.start()
		r.publish("good", map[string]string{"key": "a", "occurred_at": "1700000000123"})
		r.publish("bad", map[string]string{"key": "b", "occurred_at": "last tuesday"})
		r.publish("none", map[string]string{"key": "c"})
		r.waitCounts("all", func(c pipeline.Counts) bool { return c.Emitted == 1 && c.DeadLettered == 2 })
		dl := r.drain(r.dlSub, 2, 200*time.Millisecond)
		if len(dl) != 2 || !strings.Contains(dl[0].attrs[pipeline.AttrError], "malformed") ||
			!strings.Contains(dl[1].attrs[pipeline.AttrError], "missing") {
			t.Fatalf("dead letters %+v, want bad (malformed) and none (missing) with reasons", dl)
		}
		out := r.drain(r.outSub, 1, 200*time.Millisecond)
		if len(out) != 1 || out[0].attrs["occurred_at"] != "1700000000123" {
			t.Fatalf("output %+v, want good with its timestamp attribute kept", out)
		}
	})
	t.Run("without a dead-letter topic it is nacked, not dropped", func(t *testing.T) {
		srv, conn := newPstest(t)
		var logs testenv.Buffer
		r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{TimestampAttribute: "occurred_at"}}, log: slog.New(slog.NewTextHandler(&logs, nil))})
		r.start()
		id := r.publish("bad", map[string]string{"occurred_at": "soon"})
		r.waitCounts("nacks", func(c pipeline.Counts) bool { return c.Retried >= 3 })
		// Each delivery is held back longer than the one before (at
		// least 50, 100, 200, 400, 800 ms): it does not bounce between
		// nack and redelivery, and it is reported once, not per delivery.
		time.Sleep(1500 * time.Millisecond)
		r.stop()
		c := r.p.Counts()
		if c.Retried > 6 {
			t.Errorf("invalid message delivered %d times in about 2 s: it should be held back longer each time", c.Retried)
		}
		if n := strings.Count(logs.String(), "unusable message nacked"); n != 1 {
			t.Errorf("%d log lines for one invalid message, want 1:\n%s", n, logs.String())
		}
		if !strings.Contains(logs.String(), "message_id="+id) || !strings.Contains(logs.String(), "--dead-letter-topic") {
			t.Errorf("log does not name the message and the remedy:\n%s", logs.String())
		}
		if m := srv.Message(id); m.Acks != 0 {
			t.Fatalf("invalid message was acked %d times", m.Acks)
		}
		if c.Emitted != 0 {
			t.Fatalf("invalid message emitted: %+v", c)
		}
	})
}

// Shadow mode decides and counts as usual but emits every message.
func TestShadow(t *testing.T) {
	_, conn := newPstest(t)
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}, Shadow: true}})
	r.start()
	for _, m := range []string{"a", "b", "c"} {
		r.publish(m, map[string]string{"key": "same"})
	}
	c := r.waitCounts("three", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == 3 })
	if c.Emitted != 1 || c.DuplicateRepublish != 2 {
		t.Fatalf("counts %+v, want the same decisions as without shadow", c)
	}
	if out := r.drain(r.outSub, 3, 300*time.Millisecond); len(out) != 3 {
		t.Fatalf("shadow emitted %d messages, want all 3", len(out))
	}
}
