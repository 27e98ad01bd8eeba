package pull

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
)

// TestAckRetriesOnTheirOwn: on an exactly-once subscription, an ack the
// server fails for now is sent again on its own schedule, each pause
// longer than the last, not with every batch's ack while batches keep
// coming. The server is our broker behind an interceptor that reports the
// acks of the first confirmed batch as failed twice.
func TestAckRetriesOnTheirOwn(t *testing.T) {
	f := &failing{sent: map[string][]time.Time{}, fails: map[string]int{}}
	e := newEnv(t, streamingPullVia(t, func(ss grpc.ServerStream) grpc.ServerStream {
		return &failingStream{ServerStream: ss, f: f}
	}))
	e.exactlyOnce()

	// Messages keep coming while the retries are due, so batches are
	// acked in between.
	pctx, stopPublishing := context.WithCancel(context.Background())
	var publishing sync.WaitGroup
	publishing.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
				e.pub.Publish(pctx, &pubsub.Message{Data: []byte("m")})
			}
		}
	})
	defer publishing.Wait()
	defer stopPublishing()

	r := e.receiver(Options{Streams: 1, MaxBatch: 5})
	ack := func(_ context.Context, ms []*pubsub.Message, rs []Result) {
		for i := range rs {
			rs[i].Ack = true
		}
	}
	if err := run(t, r, ack, f.settled); err != nil {
		t.Fatal(err)
	}
	stopPublishing()

	f.mu.Lock()
	defer f.mu.Unlock()
	for id, at := range f.sent {
		want := 1
		if _, ok := f.fails[id]; ok {
			want = 1 + failTimes
		}
		if len(at) != want {
			t.Errorf("ack %s sent %d times, want %d", id, len(at), want)
			continue
		}
		// backoff.Delay's n-th pause is at least half of ackRetryMin
		// doubled n-1 times.
		for n := 1; n < len(at); n++ {
			if gap, least := at[n].Sub(at[n-1]), ackRetryMin<<(n-1)/2; gap < least {
				t.Errorf("ack %s sent again %v after its failure %d, want at least %v", id, gap, n, least)
			}
		}
	}
	if r.Stats().InvalidAcks != 0 {
		t.Errorf("stats %+v: no ack was invalid", r.Stats())
	}
}

// failTimes is how often the acks of the first confirmed batch fail.
const failTimes = 2

// failing records when each ack ID is sent, and fails the acks of the first
// confirmed batch failTimes times.
type failing struct {
	mu    sync.Mutex
	sent  map[string][]time.Time
	fails map[string]int // ack ID: failures still to report
	done  int            // failing acks finally confirmed
}

func (f *failing) settled() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.fails) > 0 && f.done == len(f.fails)
}

type failingStream struct {
	grpc.ServerStream
	f *failing
}

func (s *failingStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*pubsubpb.StreamingPullRequest); ok && err == nil && len(req.AckIds) > 0 {
		now := time.Now()
		s.f.mu.Lock()
		for _, id := range req.AckIds {
			s.f.sent[id] = append(s.f.sent[id], now)
		}
		s.f.mu.Unlock()
	}
	return err
}

func (s *failingStream) SendMsg(m any) error {
	resp, ok := m.(*pubsubpb.StreamingPullResponse)
	if c := resp.GetAcknowledgeConfirmation(); ok && c != nil {
		f := s.f
		f.mu.Lock()
		if len(f.fails) == 0 {
			for _, id := range c.AckIds {
				f.fails[id] = failTimes
			}
		}
		// The broker took the first ack; what it says of the ones sent
		// again (invalid, being done) is replaced by what this test says.
		keep := func(id string) bool { _, ok := f.fails[id]; return !ok }
		var ours []string
		for _, id := range slices.Concat(c.AckIds, c.InvalidAckIds) {
			if !keep(id) {
				ours = append(ours, id)
			}
		}
		c.AckIds = slices.DeleteFunc(c.AckIds, func(id string) bool { return !keep(id) })
		c.InvalidAckIds = slices.DeleteFunc(c.InvalidAckIds, func(id string) bool { return !keep(id) })
		for _, id := range ours {
			if f.fails[id] > 0 {
				f.fails[id]--
				c.TemporaryFailedAckIds = append(c.TemporaryFailedAckIds, id)
			} else {
				f.done++
				c.AckIds = append(c.AckIds, id)
			}
		}
		f.mu.Unlock()
	}
	return s.ServerStream.SendMsg(m)
}
