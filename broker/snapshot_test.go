package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

func snapName(id string) string { return "projects/" + project + "/snapshots/" + id }

// idxMessages are messages whose "idx" attribute numbers them from first.
func idxMessages(first, n int) []*pubsub.Message {
	var msgs []*pubsub.Message
	for i := first; i < first+n; i++ {
		msgs = append(msgs, &pubsub.Message{Data: []byte("m"), Attributes: map[string]string{"idx": fmt.Sprint(i)}})
	}
	return msgs
}

// pullIdx pulls until it holds n messages and returns their ack IDs by idx.
func pullIdx(t *testing.T, c *pubsub.Client, sub string, n int) map[string]string {
	t.Helper()
	got := map[string]string{}
	end := time.Now().Add(30 * time.Second)
	for len(got) < n && time.Now().Before(end) {
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub, MaxMessages: int32(n - len(got)), ReturnImmediately: true}) //nolint:staticcheck
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.ReceivedMessages {
			got[m.Message.Attributes["idx"]] = m.AckId
		}
		if len(r.ReceivedMessages) == 0 {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if len(got) < n {
		t.Fatalf("pulled %d of %d messages from %s", len(got), n, sub)
	}
	return got
}

func ack(t *testing.T, c *pubsub.Client, sub string, ids ...string) {
	t.Helper()
	if err := c.SubscriptionAdminClient.Acknowledge(context.Background(), &pb.AcknowledgeRequest{Subscription: sub, AckIds: ids}); err != nil {
		t.Fatal(err)
	}
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: got %v, want %v", what, err, code)
	}
}

// TestSnapshot runs the snapshot life cycle against our broker and Google's
// emulator: a snapshot keeps the messages unacknowledged when it was taken
// and those published after it; seeking to it restores exactly that backlog.
func TestSnapshot(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		ctx := context.Background()
		admin := c.SubscriptionAdminClient
		topic := createTopic(t, c)
		sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60}).Name
		publish(t, c, topic, idxMessages(0, 4)...)
		leased := pullIdx(t, c, sub, 4)
		ack(t, c, sub, leased["0"], leased["1"])

		name := snapName(unique("snap"))
		taken := time.Now()
		sn, err := admin.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: name, Subscription: sub, Labels: map[string]string{"team": "a"}})
		if err != nil {
			t.Fatal(err)
		}
		// The emulator drops labels and has no UpdateSnapshot; the service
		// keeps and updates them, and so do we.
		if sn.Name != name || sn.Topic != topic || (tg.ours != nil && sn.Labels["team"] != "a") {
			t.Errorf("created %v", sn)
		}
		// The oldest unacknowledged message is seconds old: 7 days from now.
		if d := sn.ExpireTime.AsTime().Sub(taken); d < 7*24*time.Hour-time.Minute || d > 7*24*time.Hour+time.Minute {
			t.Errorf("snapshot expires in %v, want about 7 days", d)
		}
		_, err = admin.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: name, Subscription: sub})
		wantCode(t, "the same snapshot again", err, codes.AlreadyExists)
		_, err = admin.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapName(unique("snap")), Subscription: subName(unique("nosuch"))})
		wantCode(t, "a snapshot of a missing subscription", err, codes.NotFound)

		// Acks after the snapshot, and a message published after it.
		ack(t, c, sub, leased["2"], leased["3"])
		publish(t, c, topic, idxMessages(4, 1)...)
		if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{4}) {
			t.Fatalf("before the seek: %v, want [4]", got)
		}
		if _, err := admin.Seek(ctx, &pb.SeekRequest{Subscription: sub, Target: &pb.SeekRequest_Snapshot{Snapshot: name}}); err != nil {
			t.Fatal(err)
		}
		if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{2, 3, 4}) {
			t.Errorf("after seeking to the snapshot: %v, want [2 3 4]", got)
		}

		got, err := admin.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: name})
		if err != nil || got.Topic != topic || !got.ExpireTime.AsTime().Equal(sn.ExpireTime.AsTime()) {
			t.Errorf("get: %v %v", got, err)
		}
		if tg.ours != nil {
			up, err := admin.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{
				Snapshot:   &pb.Snapshot{Name: name, Labels: map[string]string{"team": "b"}},
				UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"labels"}},
			})
			if err != nil || up.Labels["team"] != "b" {
				t.Errorf("update labels: %v %v", up, err)
			}
		}
		ts, err := c.TopicAdminClient.ListTopicSnapshots(ctx, &pb.ListTopicSnapshotsRequest{Topic: topic}).Next()
		if err != nil || ts != name {
			t.Errorf("topic snapshots: %q %v, want %s", ts, err, name)
		}
		found := false
		for it := admin.ListSnapshots(ctx, &pb.ListSnapshotsRequest{Project: "projects/" + project}); ; {
			s, err := it.Next()
			if err != nil {
				break
			}
			found = found || s.Name == name
		}
		if !found {
			t.Errorf("ListSnapshots does not list %s", name)
		}

		other := createSub(t, c, &pb.Subscription{Topic: createTopic(t, c)}).Name
		_, err = admin.Seek(ctx, &pb.SeekRequest{Subscription: other, Target: &pb.SeekRequest_Snapshot{Snapshot: name}})
		wantCode(t, "seek to a snapshot of another topic", err, codes.FailedPrecondition)
		if err := admin.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: name}); err != nil {
			t.Fatal(err)
		}
		_, err = admin.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: name})
		wantCode(t, "get after delete", err, codes.NotFound)
		_, err = admin.Seek(ctx, &pb.SeekRequest{Subscription: sub, Target: &pb.SeekRequest_Snapshot{Snapshot: name}})
		wantCode(t, "seek to a deleted snapshot", err, codes.NotFound)
	})
}

// TestSnapshotExpiry: a snapshot lives 7 days minus the age of the oldest
// message it keeps; one that would live less than an hour is refused; the
// expiry can be brought forward but not pushed back.
func TestSnapshotExpiry(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	admin := c.SubscriptionAdminClient
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic}).Name
	publish(t, c, topic, idxMessages(0, 1)...)
	published := tg.clock.Now()
	tg.clock.Advance(3 * 24 * time.Hour)
	name := snapName(unique("snap"))
	sn, err := admin.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: name, Subscription: sub})
	if err != nil {
		t.Fatal(err)
	}
	if want := published.Add(7 * 24 * time.Hour); !sn.ExpireTime.AsTime().Equal(want) {
		t.Errorf("expires at %v, want %v (7 days after the oldest message)", sn.ExpireTime.AsTime(), want)
	}
	later := timestamppb.New(sn.ExpireTime.AsTime().Add(time.Hour))
	_, err = admin.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{Snapshot: &pb.Snapshot{Name: name, ExpireTime: later},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"expire_time"}}})
	wantCode(t, "pushing the expiry back", err, codes.InvalidArgument)
	earlier := sn.ExpireTime.AsTime().Add(-24 * time.Hour)
	up, err := admin.UpdateSnapshot(ctx, &pb.UpdateSnapshotRequest{Snapshot: &pb.Snapshot{Name: name, ExpireTime: timestamppb.New(earlier)},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"expire_time"}}})
	if err != nil || !up.ExpireTime.AsTime().Equal(earlier) {
		t.Fatalf("bringing the expiry forward: %v %v", up, err)
	}

	tg.clock.Advance(3*24*time.Hour + 23*time.Hour + 30*time.Minute) // the message is 6d23h30m old
	_, err = admin.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snapName(unique("snap")), Subscription: sub})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "expire in 30m0s") {
		t.Errorf("a snapshot that would live 30 minutes: got %v, want FailedPrecondition", err)
	}
	_, err = admin.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: name})
	wantCode(t, "get after the expiry", err, codes.NotFound)
}

// TestSnapshotRestart: snapshots, their messages and a seek to one survive
// restarts, replayed from the log and from a checkpoint.
func TestSnapshotRestart(t *testing.T) {
	dir := t.TempDir()
	clock := newFakeClock()
	tg := startOurs(t, Options{DataDir: dir, Now: clock.Now})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: `attributes.idx != "5"`}).Name
	publish(t, c, topic, idxMessages(0, 3)...)
	leased := pullIdx(t, c, sub, 3)
	ack(t, c, sub, leased["0"])
	name := snapName(unique("snap"))
	sn, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: name, Subscription: sub, Labels: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	ack(t, c, sub, leased["1"], leased["2"])
	publish(t, c, topic, idxMessages(3, 3)...) // 5 does not pass the filter
	if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{3, 4}) {
		t.Fatalf("before restart: %v, want [3 4]", got)
	}
	c.Close()
	b := tg.ours
	for round := range 2 { // the first start replays the log, the second a checkpoint
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		tg = startOurs(t, Options{DataDir: dir, Now: clock.Now})
		b = tg.ours
		c = newClient(t, tg.addr)
		got, err := c.SubscriptionAdminClient.GetSnapshot(ctx, &pb.GetSnapshotRequest{Snapshot: name})
		if err != nil || got.Labels["k"] != "v" || !got.ExpireTime.AsTime().Equal(sn.ExpireTime.AsTime()) || got.Topic != topic {
			t.Fatalf("round %d: snapshot after restart: %v %v", round, got, err)
		}
		s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
		if err != nil || s.Filter != `attributes.idx != "5"` {
			t.Fatalf("round %d: subscription after restart: %v %v", round, s, err)
		}
		if round == 0 {
			if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: sub, Target: &pb.SeekRequest_Snapshot{Snapshot: name}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The seek before the last two starts stands: 1 and 2 were unacked
	// when the snapshot was taken, 3 and 4 came after, 5 is filtered out.
	if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{1, 2, 3, 4}) {
		t.Errorf("after seek and restarts: %v, want [1 2 3 4]", got)
	}
}

// TestKill9KeepsFilterAndSnapshot: a subscription's filter and dead-letter
// policy, and a snapshot with its messages, survive kill -9 of a broker
// with a data dir.
func TestKill9KeepsFilterAndSnapshot(t *testing.T) {
	bin := buildBrokerd(t)
	dir := t.TempDir()
	cmd, addr := startBrokerd(t, bin, dir)
	c := newClient(t, addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	dlTopic := createTopic(t, c)
	const filter = `attributes:idx AND NOT attributes.idx = "1"`
	dl := &pb.DeadLetterPolicy{DeadLetterTopic: dlTopic, MaxDeliveryAttempts: 7}
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Filter: filter, DeadLetterPolicy: dl}).Name
	publish(t, c, topic, idxMessages(0, 3)...)
	name := snapName(unique("snap"))
	if _, err := c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: name, Subscription: sub}); err != nil {
		t.Fatal(err)
	}
	if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("before the kill: %v, want [0 2]", got)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	c.Close()

	cmd, addr = startBrokerd(t, bin, dir)
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("broker exit: %v", err)
		}
	}()
	c = newClient(t, addr)
	s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub})
	if err != nil || s.Filter != filter || !proto.Equal(s.DeadLetterPolicy, dl) {
		t.Fatalf("subscription after kill -9: %v %v", s, err)
	}
	publish(t, c, topic, idxMessages(1, 3)...) // 1 is filtered out again
	if _, err := c.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: sub, Target: &pb.SeekRequest_Snapshot{Snapshot: name}}); err != nil {
		t.Fatalf("seek to the snapshot after kill -9: %v", err)
	}
	if got := pullAllIdx(t, c, sub); !slices.Equal(got, []int{0, 2, 2, 3}) {
		t.Errorf("after kill -9 and seek: %v, want [0 2 2 3]", got)
	}
}
