package broker

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestKillUnderLoad runs 4 publishers and 4 subscribers (two on an
// at-least-once subscription, two on an exactly-once one) flat out against
// a broker process, SIGKILLs it and restarts it on the same data dir and
// port, several times, and then checks the promises of a durable broker:
// every publish that got an answer is delivered on both subscriptions; no
// message is delivered that was never published, or with other contents;
// a message whose exactly-once ack succeeded never comes back. It logs the
// rates before and after each restart and how long deliveries took to move
// again. BROKER_KILLS (default 3) and BROKER_KILL_LOAD (default 2s of load
// between kills) make it the full run:
//
//	BROKER_KILLS=10 BROKER_KILL_LOAD=3s go test -run KillUnderLoad -v ./broker
func TestKillUnderLoad(t *testing.T) {
	kills := envInt("BROKER_KILLS", 3)
	load := 2 * time.Second
	if d, err := time.ParseDuration(os.Getenv("BROKER_KILL_LOAD")); err == nil && d > 0 {
		load = d
	}
	bin, dir := buildBrokerd(t), t.TempDir()
	cmd, addr := startBrokerd(t, bin, dir)
	defer func() {
		if cmd != nil {
			cmd.Process.Signal(syscall.SIGTERM)
			cmd.Wait()
		}
	}()
	c := newClient(t, addr)
	topic := createTopic(t, c)
	plain := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 10})
	eod := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 10, EnableExactlyOnceDelivery: true})
	k := newKillLoad()
	ctx, stopPub := context.WithCancel(context.Background())
	var pubs sync.WaitGroup
	for w := range 4 {
		pubs.Go(func() { k.publish(ctx, c, topic, w) })
	}
	rctx, stopSub := context.WithCancel(context.Background())
	var subs sync.WaitGroup
	for i := range 4 {
		sub, exact := plain.Name, false
		if i >= 2 {
			sub, exact = eod.Name, true
		}
		subs.Go(func() {
			if err := k.receive(rctx, c, sub, exact); err != nil {
				t.Errorf("receive from %s: %v", sub, err)
			}
		})
	}

	type cycle struct {
		pubRate, recvRate          float64
		ready, recover, pubRecover time.Duration
	}
	measure := func() (pubRate, recvRate float64) {
		p0, r0, t0 := k.answered.Load(), k.received.Load(), time.Now()
		time.Sleep(load) // the load phase itself, not a wait for an event
		d := time.Since(t0).Seconds()
		return float64(k.answered.Load()-p0) / d, float64(k.received.Load()-r0) / d
	}
	var cycles []cycle
	first := k.moved()
	select {
	case <-first:
	case <-time.After(60 * time.Second):
		t.Fatal("no delivery within 60s of the first start")
	}
	p, r := measure()
	cycles = append(cycles, cycle{pubRate: p, recvRate: r})
	for range kills {
		var rec, pubRec time.Duration
		kill9(t, cmd)
		cmd = nil
		start := time.Now()
		cmd, _ = startBrokerd(t, bin, dir, "--listen", addr)
		// Only now: what the client still had buffered from the killed
		// process does not count as recovery.
		ready := time.Since(start)
		moved, answered := k.moved(), k.answeredAgain()
		for moved != nil || answered != nil {
			select {
			case <-moved:
				rec, moved = time.Since(start), nil
			case <-answered:
				pubRec, answered = time.Since(start), nil
			case <-time.After(60 * time.Second):
				t.Fatalf("deliveries or publishes did not resume within 60s of restart %d", len(cycles))
			}
		}
		p, r := measure()
		cycles = append(cycles, cycle{pubRate: p, recvRate: r, ready: ready, recover: rec, pubRecover: pubRec})
	}
	stopPub()
	pubs.Wait()

	// Everything answered must arrive on both subscriptions.
	answered := k.answeredIDs()
	// Draining the backlog takes as long as it takes on a slow machine; the
	// test fails when deliveries stop for a minute.
	const stall = 60 * time.Second
	idle := time.NewTimer(stall)
	defer idle.Stop()
	for _, sub := range []string{plain.Name, eod.Name} {
		for _, id := range answered {
			for !k.delivered(sub, id) {
				select {
				case <-k.progress:
					idle.Reset(stall)
				case <-idle.C:
					stopSub()
					subs.Wait()
					t.Fatalf("%s: answered publish %s not delivered, and no delivery for %v", sub, id, stall)
				}
			}
		}
	}
	stopSub()
	subs.Wait()

	var recs []time.Duration
	for i, cy := range cycles {
		if i == 0 {
			t.Logf("start: %.0f publishes/s answered, %.0f deliveries/s", cy.pubRate, cy.recvRate)
			continue
		}
		recs = append(recs, cy.recover)
		t.Logf("kill %d: serving %v after restart, deliveries again after %v, publishes answered again after %v; then %.0f publishes/s answered, %.0f deliveries/s",
			i, cy.ready.Round(time.Millisecond), cy.recover.Round(time.Millisecond), cy.pubRecover.Round(time.Millisecond), cy.pubRate, cy.recvRate)
	}
	slices.Sort(recs)
	t.Logf("%d publishes answered, %d deliveries; %d kills, recovery median %v, worst %v", len(answered), k.received.Load(),
		kills, recs[len(recs)/2].Round(time.Millisecond), recs[len(recs)-1].Round(time.Millisecond))
	k.mu.Lock()
	t.Logf("%d exactly-once acks succeeded", len(k.ackedAt))
	k.mu.Unlock()
	for _, p := range k.problems(eod.Name) {
		t.Error(p)
	}
}

// killLoad is the bookkeeping of TestKillUnderLoad's clients.
type killLoad struct {
	answered, received atomic.Int64
	progress           chan struct{} // a delivery happened (lossy)

	mu        sync.Mutex
	attempted [4]int            // per publisher: payloads w<i>-0 … w<i>-(n-1) were published
	ids       map[string]string // answered message ID -> payload
	got       map[string]map[string]int
	ackedAt   map[string]int // exactly-once: deliveries seen when an ack succeeded
	bad       []string
	signal    chan struct{} // closed by the next delivery
	pubSignal chan struct{} // closed by the next answered publish
}

func newKillLoad() *killLoad {
	return &killLoad{progress: make(chan struct{}, 1), ids: map[string]string{},
		got: map[string]map[string]int{}, ackedAt: map[string]int{}}
}

// moved returns a channel that the next delivery closes.
func (k *killLoad) moved() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.signal = make(chan struct{})
	return k.signal
}

// answeredAgain returns a channel that the next answered publish closes.
func (k *killLoad) answeredAgain() <-chan struct{} {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pubSignal = make(chan struct{})
	return k.pubSignal
}

func (k *killLoad) publish(ctx context.Context, c *pubsub.Client, topic string, w int) {
	p := c.Publisher(topic)
	p.PublishSettings.Timeout = 5 * time.Second // a publish to a dead broker fails, as a user's would
	p.PublishSettings.FlowControlSettings.MaxOutstandingMessages = 5000
	p.PublishSettings.FlowControlSettings.LimitExceededBehavior = pubsub.FlowControlBlock
	type pending struct {
		r       *pubsub.PublishResult
		payload string
	}
	results := make(chan pending, 5000)
	var collect sync.WaitGroup
	collect.Go(func() {
		for pr := range results {
			id, err := pr.r.Get(context.Background())
			if err != nil {
				continue
			}
			k.mu.Lock()
			k.ids[id] = pr.payload
			if k.pubSignal != nil {
				close(k.pubSignal)
				k.pubSignal = nil
			}
			k.mu.Unlock()
			k.answered.Add(1)
		}
	})
	for i := 0; ctx.Err() == nil; i++ {
		payload := fmt.Sprintf("w%d-%d", w, i)
		k.mu.Lock()
		k.attempted[w] = i + 1
		k.mu.Unlock()
		r := p.Publish(ctx, &pubsub.Message{Data: []byte(payload)})
		results <- pending{r, payload}
	}
	p.Stop()
	close(results)
	collect.Wait()
}

func (k *killLoad) receive(ctx context.Context, c *pubsub.Client, sub string, exact bool) error {
	s := c.Subscriber(sub)
	s.ReceiveSettings.MaxOutstandingMessages = 2000
	acks := make(chan func(), 10000)
	var wg sync.WaitGroup
	wg.Go(func() {
		for f := range acks {
			f()
		}
	})
	err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		n := k.record(sub, m)
		if !exact {
			m.Ack()
			return
		}
		r := m.AckWithResult()
		acks <- func() {
			if st, err := r.Get(context.Background()); err == nil && st == pubsub.AcknowledgeStatusSuccess {
				k.mu.Lock()
				k.ackedAt[m.ID] = max(k.ackedAt[m.ID], n)
				k.mu.Unlock()
			}
		}
	})
	close(acks)
	wg.Wait()
	return err
}

// record notes a delivery and returns how many times sub has seen the
// message, this one included.
func (k *killLoad) record(sub string, m *pubsub.Message) int {
	payload := string(m.Data)
	k.mu.Lock()
	defer k.mu.Unlock()
	seen := k.got[sub]
	if seen == nil {
		seen = map[string]int{}
		k.got[sub] = seen
	}
	seen[m.ID]++
	if want, ok := k.ids[m.ID]; ok && want != payload {
		k.bad = append(k.bad, fmt.Sprintf("%s: message %s delivered with %q, published as %q", sub, m.ID, payload, want))
	}
	if !k.publishedLocked(payload) {
		k.bad = append(k.bad, fmt.Sprintf("%s: message %s delivered with %q, which was never published", sub, m.ID, payload))
	}
	if k.signal != nil {
		close(k.signal)
		k.signal = nil
	}
	k.received.Add(1)
	select {
	case k.progress <- struct{}{}:
	default:
	}
	return seen[m.ID]
}

func (k *killLoad) publishedLocked(payload string) bool {
	w, i, ok := strings.Cut(strings.TrimPrefix(payload, "w"), "-")
	wn, err1 := strconv.Atoi(w)
	in, err2 := strconv.Atoi(i)
	return ok && err1 == nil && err2 == nil && wn >= 0 && wn < len(k.attempted) && in < k.attempted[wn]
}

func (k *killLoad) delivered(sub, id string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.got[sub][id] > 0
}

func (k *killLoad) answeredIDs() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	ids := make([]string, 0, len(k.ids))
	for id := range k.ids {
		ids = append(ids, id)
	}
	return ids
}

// problems lists every broken promise; eod is the exactly-once subscription.
func (k *killLoad) problems(eod string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	bad := slices.Clone(k.bad)
	for id, n := range k.ackedAt {
		if got := k.got[eod][id]; got > n {
			bad = append(bad, fmt.Sprintf("%s: message %s delivered %d times, %d of them after an exactly-once ack succeeded", eod, id, got, got-n))
		}
	}
	return bad
}
