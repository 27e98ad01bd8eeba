package broker

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// drainIDs receives from sub, acking everything, until done says so or
// timeout passes, and returns the message IDs seen.
func drainIDs(t *testing.T, c *pubsub.Client, sub string, done func(map[string]bool) bool, timeout time.Duration) map[string]bool {
	t.Helper()
	got := map[string]bool{}
	var mu sync.Mutex
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s := c.Subscriber(sub)
	s.ReceiveSettings.MaxOutstandingMessages = 5000
	err := s.Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		got[m.ID] = true
		finished := done(got)
		mu.Unlock()
		m.Ack()
		if finished {
			cancel()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	return got
}

// TestRestartKeepsState closes and reopens a broker on the same data dir,
// with a compaction in between, and a torn record at the end of the log.
func TestRestartKeepsState(t *testing.T) {
	dir := t.TempDir()
	tg := startOurs(t, Options{DataDir: dir})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 30,
		DeadLetterPolicy: nil, RetainAckedMessages: true, MessageRetentionDuration: nil})
	var msgs []*pubsub.Message
	for i := range 300 {
		msgs = append(msgs, &pubsub.Message{Data: fmt.Appendf(nil, "m%d", i), Attributes: map[string]string{"i": fmt.Sprint(i)}})
	}
	ids := publish(t, c, topic, msgs[:200]...)
	// Ack the first 100 through unary pulls.
	acked := map[string]bool{}
	for len(acked) < 100 {
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub.Name, MaxMessages: int32(100 - len(acked))})
		if err != nil {
			t.Fatal(err)
		}
		var ackIDs []string
		for _, m := range r.ReceivedMessages {
			acked[m.Message.MessageId] = true
			ackIDs = append(ackIDs, m.AckId)
		}
		if err := c.SubscriptionAdminClient.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: sub.Name, AckIds: ackIDs}); err != nil {
			t.Fatal(err)
		}
	}
	b := tg.ours
	if err := b.compact(); err != nil {
		t.Fatal(err)
	}
	ids = append(ids, publish(t, c, topic, msgs[200:]...)...)
	c.Close()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// A crash in the middle of a write leaves a torn record behind.
	f, err := os.OpenFile(filepath.Join(dir, logName), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{200, 0, 0, 0, 1, 2, 3})
	f.Close()

	tg2 := startOurs(t, Options{DataDir: dir})
	c2 := newClient(t, tg2.addr)
	got, err := c2.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: sub.Name})
	if err != nil || !got.RetainAckedMessages {
		t.Fatalf("subscription after restart: %v %v", got, err)
	}
	recv := drainIDs(t, c2, sub.Name, func(got map[string]bool) bool { return len(got) >= 200 }, 20*time.Second)
	for _, id := range ids {
		if !acked[id] && !recv[id] {
			t.Errorf("message %s lost across restart", id)
		}
	}
	if len(recv) != 200 {
		t.Errorf("received %d messages after restart, want 200", len(recv))
	}
	// New IDs continue after the old ones.
	next := publish(t, c2, topic, &pubsub.Message{Data: []byte("new")})[0]
	for _, id := range ids {
		if id == next {
			t.Fatalf("message ID %s reused after restart", id)
		}
	}
	// The log was cut at the torn record and appended to: what came after
	// the restart is still there after the next one.
	c2.Close()
	if err := tg2.ours.Close(); err != nil {
		t.Fatal(err)
	}
	tg3 := startOurs(t, Options{DataDir: dir})
	c3 := newClient(t, tg3.addr)
	if got := drainIDs(t, c3, sub.Name, func(got map[string]bool) bool { return got[next] }, 20*time.Second); !got[next] {
		t.Errorf("message %s published after the first restart is lost after the second", next)
	}
}

// buildBrokerd builds the broker process the crash tests kill.
func buildBrokerd(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "brokerd")
	if out, err := exec.Command("go", "build", "-o", bin, "./internal/brokerd").CombinedOutput(); err != nil {
		t.Fatalf("build brokerd: %v\n%s", err, out)
	}
	return bin
}

// startBrokerd starts it on dir (and its other flags) and returns it with
// its address.
func startBrokerd(t testing.TB, bin, dir string, flags ...string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--data-dir", dir}, flags...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("read broker address: %v", err)
	}
	return cmd, line[:len(line)-1]
}

// kill9 SIGKILLs a broker process that startBrokerd started and waits for
// its end.
func kill9(t testing.TB, cmd *exec.Cmd) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
}

// TestKill9 kills a broker process with SIGKILL while publishers are
// running, restarts it on the same data dir, and checks that every
// publish that was acknowledged and not yet consumed is delivered.
func TestKill9(t *testing.T) {
	bin := buildBrokerd(t)
	dir := t.TempDir()
	start := func() (*exec.Cmd, string) { return startBrokerd(t, bin, dir) }
	cmd, addr := start()
	c := newClient(t, addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic})

	var mu sync.Mutex
	var published []string
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := c.Publisher(topic)
			p.PublishSettings.CountThreshold = 50
			p.PublishSettings.Timeout = 2 * time.Second // give up quickly once the broker is dead
			for i := 0; ctx.Err() == nil; i++ {
				r := p.Publish(ctx, &pubsub.Message{Data: fmt.Appendf(nil, "w%d-%d", w, i), Attributes: map[string]string{"w": fmt.Sprint(w)}})
				go func() {
					if id, err := r.Get(context.Background()); err == nil {
						mu.Lock()
						published = append(published, id)
						mu.Unlock()
					}
				}()
				if i%50 == 49 {
					time.Sleep(time.Millisecond)
				}
			}
			p.Stop()
		}()
	}
	// The kill comes once thousands of publishes were acknowledged, with
	// more under way, however slow the machine.
	for end := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		n := len(published)
		mu.Unlock()
		if n >= 5000 || time.Now().After(end) {
			break
		}
	}
	kill9(t, cmd)
	cancel()
	wg.Wait()
	c.Close()
	mu.Lock()
	acknowledged := append([]string(nil), published...)
	mu.Unlock()
	if len(acknowledged) < 100 {
		t.Fatalf("only %d publishes acknowledged before the kill; the test proves nothing", len(acknowledged))
	}

	cmd2, addr2 := start()
	defer func() {
		cmd2.Process.Signal(syscall.SIGTERM)
		if err := cmd2.Wait(); err != nil {
			t.Errorf("broker exit: %v", err)
		}
	}()
	c2 := newClient(t, addr2)
	// got only grows, so the first acknowledged ID not yet received only
	// moves forward; rescanning from the start for every message made the
	// check quadratic, slower than the broker once >100k publishes were in.
	next := 0
	got := drainIDs(t, c2, sub.Name, func(got map[string]bool) bool {
		for next < len(acknowledged) && got[acknowledged[next]] {
			next++
		}
		return next == len(acknowledged)
	}, 60*time.Second)
	lost := 0
	for _, id := range acknowledged {
		if !got[id] {
			lost++
		}
	}
	t.Logf("%d publishes acknowledged before kill -9, %d delivered after restart", len(acknowledged), len(got))
	if lost > 0 {
		t.Errorf("%d of %d acknowledged publishes lost", lost, len(acknowledged))
	}
}

// TestRestartAfterSeek checks that a seek is replayed from the log: acked
// messages that a seek made unacked again are still unacked after a restart.
func TestRestartAfterSeek(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	tg := startOurs(t, Options{DataDir: dir, Now: clock.Now})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, RetainAckedMessages: true})
	before := clock.Now()
	clock.Advance(time.Second)
	ids := publish(t, c, topic, &pubsub.Message{Data: []byte("a")}, &pubsub.Message{Data: []byte("b")}, &pubsub.Message{Data: []byte("c")})
	drainIDs(t, c, sub.Name, func(got map[string]bool) bool { return len(got) == 3 }, 10*time.Second)
	seekTo(t, c, sub.Name, before)
	c.Close()
	if err := tg.ours.Close(); err != nil {
		t.Fatal(err)
	}
	tg2 := startOurs(t, Options{DataDir: dir, Now: clock.Now})
	c2 := newClient(t, tg2.addr)
	got := drainIDs(t, c2, sub.Name, func(got map[string]bool) bool { return len(got) == 3 }, 10*time.Second)
	for _, id := range ids {
		if !got[id] {
			t.Errorf("message %s not redelivered after seek and restart (got %v)", id, got)
		}
	}
}

// heldSeqs lists the messages that sub holds, in publish order.
func heldSeqs(b *Broker, sub string) []uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	var seqs []uint64
	b.subs[sub].forEachHeld(func(m *message) { seqs = append(seqs, m.seq) })
	slices.Sort(seqs)
	return seqs
}

// TestCompactUnderLoad compacts the log while publishes and acks go on,
// and checks that a restart rebuilds exactly the state before it: records
// appended while a checkpoint was written must follow it in the new log.
func TestCompactUnderLoad(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, NoSync: true, Now: time.Now, PullWait: 10 * time.Millisecond, Logger: testLogger(t)}
	b, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	topic, sub := topicName(unique("t")), subName(unique("s"))
	if _, err := b.pub.CreateTopic(ctx, &pb.Topic{Name: topic}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.sub.CreateSubscription(ctx, &pb.Subscription{Name: sub, Topic: topic, AckDeadlineSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	stop, started := make(chan struct{}), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		defer close(started) // also when it fails
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			req := &pb.PublishRequest{Topic: topic}
			for j := range 100 {
				req.Messages = append(req.Messages, &pb.PubsubMessage{Data: fmt.Appendf(nil, "%d-%d", i, j), Attributes: map[string]string{"k": "v"}})
			}
			if _, err := b.pub.Publish(ctx, req); err != nil {
				t.Error(err)
				return
			}
			if i == 10 {
				started <- struct{}{}
			}
		}
	})
	<-started
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			r, err := b.sub.Pull(ctx, &pb.PullRequest{Subscription: sub, MaxMessages: 50})
			if err != nil {
				t.Error(err)
				return
			}
			var ids []string
			for _, m := range r.ReceivedMessages {
				ids = append(ids, m.AckId)
			}
			if len(ids) > 0 {
				if _, err := b.sub.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: ids[:len(ids)/2]}); err != nil {
					t.Error(err)
					return
				}
			}
		}
	})
	for range 5 {
		if err := b.compact(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	want := heldSeqs(b, sub)
	if len(want) < 100 {
		t.Fatalf("only %d messages held; the test proves little", len(want))
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if got := heldSeqs(b2, sub); !slices.Equal(got, want) {
		t.Fatalf("after restart %d messages held, want %d", len(got), len(want))
	}
}
