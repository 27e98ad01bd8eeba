package broker

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/storage"
	"github.com/hamba/avro/v2/ocf"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// storageServer is a client of the test's Cloud Storage server and a
// fresh bucket on it.
func storageServer(t testing.TB) (host string, client *storage.Client, bucket string) {
	t.Helper()
	host = testenv.StorageEmulatorHost(t)
	client, err := storage.NewClient(context.Background(),
		option.WithEndpoint(strings.TrimSuffix(host, "/")+"/storage/v1/"), option.WithoutAuthentication(), storage.WithJSONReads())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	bucket = strings.ToLower(unique("bkt"))
	if err := client.Bucket(bucket).Create(context.Background(), "p", nil); err != nil {
		t.Fatal(err)
	}
	return host, client, bucket
}

// objects waits until the bucket holds at least n objects under prefix and
// returns their names and contents, in name order.
func objects(t testing.TB, client *storage.Client, bucket, prefix string, n int) (names []string, contents [][]byte) {
	t.Helper()
	ctx := context.Background()
	for end := time.Now().Add(2 * time.Minute); ; {
		names = names[:0]
		it := client.Bucket(bucket).Objects(ctx, &storage.Query{Prefix: prefix})
		for {
			a, err := it.Next()
			if errors.Is(err, iterator.Done) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, a.Name)
		}
		if len(names) >= n {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("bucket %s holds %v under %q, want %d objects", bucket, names, prefix, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, name := range names {
		r, err := client.Bucket(bucket).Object(name).NewReader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		contents = append(contents, b)
	}
	return names, contents
}

// waitStorageState waits until the subscription shows state.
func waitStorageState(t *testing.T, c *pubsub.Client, sub string, want pb.CloudStorageConfig_State) {
	t.Helper()
	var got pb.CloudStorageConfig_State
	for end := time.Now().Add(2 * time.Minute); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		s, err := c.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: sub})
		if err != nil {
			t.Fatal(err)
		}
		if got = s.CloudStorageConfig.GetState(); got == want {
			return
		}
	}
	t.Fatalf("subscription %s: cloud storage state %v, want %v", sub, got, want)
}

// backlogEmpty waits until the subscription has nothing left to deliver:
// every message exported was acknowledged. The exporter acknowledges once
// the destination has confirmed the write, so a test can see the rows or
// objects a moment before the acks.
func backlogEmpty(t *testing.T, b *Broker, sub string) {
	t.Helper()
	held := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.subs[sub].held
	}
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		n := held()
		if n == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("subscription %s still holds %d messages after the export", sub, n)
		}
	}
}

func TestStorageExportText(t *testing.T) {
	host, client, bucket := storageServer(t)
	tg := startOurs(t, Options{Exports: ExportOptions{StorageHost: host}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, CloudStorageConfig: &pb.CloudStorageConfig{
		Bucket: bucket, FilenamePrefix: "in/", FilenameSuffix: ".txt", FilenameDatetimeFormat: "YYYY/MM/DD/hh_mm_ss",
		MaxBytes: 1000,
	}})
	if st := sub.CloudStorageConfig; st.State != pb.CloudStorageConfig_ACTIVE || st.MaxDuration.AsDuration() != time.Minute ||
		st.GetTextConfig() == nil {
		t.Fatalf("created %v: want state ACTIVE, max_duration capped at the ack deadline (1m), text output", st)
	}
	a, bb, cc := strings.Repeat("a", 400), strings.Repeat("b", 400), strings.Repeat("c", 400)
	publish(t, c, topic, &pubsub.Message{Data: []byte(a)}, &pubsub.Message{Data: []byte(bb)}, &pubsub.Message{Data: []byte(cc)})
	names, contents := objects(t, client, bucket, "in/", 1)
	if !regexp.MustCompile(`^in/\d{4}/\d{2}/\d{2}/\d{2}_\d{2}_\d{2}_[0-9a-f]{8}-[0-9a-f-]{27}\.txt$`).MatchString(names[0]) {
		t.Errorf("object name %q is not <prefix><date-time>_<uuid><suffix>", names[0])
	}
	if got, want := string(bytes.Join(contents, nil)), a+"\n"+bb+"\n"+cc+"\n"; got != want {
		t.Errorf("objects hold %q, want one message per line", got)
	}
	backlogEmpty(t, tg.ours, sub.Name)

	// The Go client's update changes the config; the state stays output only.
	up, err := c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, CloudStorageConfig: &pb.CloudStorageConfig{
			Bucket: bucket, FilenamePrefix: "in/", FilenameSuffix: ".txt", FilenameDatetimeFormat: "YYYY/MM/DD/hh_mm_ss",
			MaxBytes: 1000, MaxMessages: 5000, State: pb.CloudStorageConfig_PERMISSION_DENIED}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"cloud_storage_config"}}})
	if err != nil || up.CloudStorageConfig.MaxMessages != 5000 || up.CloudStorageConfig.State != pb.CloudStorageConfig_ACTIVE {
		t.Fatalf("update: %v, %v; want max_messages 5000 and the state ACTIVE, not the one sent", up.GetCloudStorageConfig(), err)
	}
	_, err = c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name}, UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"cloud_storage_config.state"}}})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("update of the output-only state: %v, want InvalidArgument", err)
	}

	// A batch under every bound is written once max_duration passes.
	publish(t, c, topic, &pubsub.Message{Data: []byte("late")})
	leased(t, tg.ours, sub.Name, 1) // in the batch before the clock moves
	tg.clock.Advance(time.Minute)
	_, contents = objects(t, client, bucket, "in/", 2)
	if got := string(contents[len(contents)-1]) + string(contents[0]); !strings.Contains(got, "late\n") {
		t.Errorf("after max_duration, objects hold %q, want the late message", got)
	}
}

func TestStorageExportAvro(t *testing.T) {
	host, client, bucket := storageServer(t)
	tg := startOurs(t, Options{Exports: ExportOptions{StorageHost: host}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, EnableMessageOrdering: true,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: bucket, MaxBytes: 1000,
			OutputFormat: &pb.CloudStorageConfig_AvroConfig_{AvroConfig: &pb.CloudStorageConfig_AvroConfig{WriteMetadata: true}}}})
	big := bytes.Repeat([]byte{0xff, 0x00}, 600)
	p := c.Publisher(topic)
	p.EnableMessageOrdering = true
	id, err := p.Publish(context.Background(), &pubsub.Message{Data: big, Attributes: map[string]string{"k": "v"}, OrderingKey: "o"}).Get(context.Background())
	p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	_, contents := objects(t, client, bucket, "", 1)
	dec, err := ocf.NewDecoder(bytes.NewReader(contents[0]))
	if err != nil {
		t.Fatal(err)
	}
	if name := dec.Schema().(interface{ FullName() string }).FullName(); name != "PubsubMessageWithMetadata" {
		t.Errorf("record %s, want PubsubMessageWithMetadata", name)
	}
	var recs []avroRecord
	for dec.HasNext() {
		var r avroRecord
		if err := dec.Decode(&r); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	if len(recs) != 1 {
		t.Fatalf("%d records, want 1", len(recs))
	}
	r := recs[0]
	if r.SubscriptionName != sub.Name || r.MessageID != id || !bytes.Equal(r.Data, big) ||
		r.Attributes["k"] != "v" || r.Attributes["ordering_key"] != "o" || time.Since(r.PublishTime) > time.Minute {
		t.Errorf("record %+v: want the message with its metadata, the ordering key among the attributes", r)
	}
}

func TestStorageExportMissingBucket(t *testing.T) {
	host, client, _ := storageServer(t)
	tg := startOurs(t, Options{Exports: ExportOptions{StorageHost: host}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	bucket := strings.ToLower(unique("later"))
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: bucket, MaxBytes: 1000}})
	waitStorageState(t, c, sub.Name, pb.CloudStorageConfig_NOT_FOUND)
	publish(t, c, topic, &pubsub.Message{Data: bytes.Repeat([]byte("x"), 1000)})
	if err := client.Bucket(bucket).Create(context.Background(), "p", nil); err != nil {
		t.Fatal(err)
	}
	waitStorageState(t, c, sub.Name, pb.CloudStorageConfig_ACTIVE)
	if _, contents := objects(t, client, bucket, "", 1); len(contents[0]) != 1001 {
		t.Errorf("the object holds %d bytes, want the message kept while the bucket was missing", len(contents[0]))
	}
	backlogEmpty(t, tg.ours, sub.Name)
}

func TestStorageExportNoEndpoint(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: "some-bucket"}})
	waitStorageState(t, c, sub.Name, pb.CloudStorageConfig_NOT_FOUND)
	ids := publish(t, c, topic, &pubsub.Message{Data: []byte("kept")})
	tg.clock.Advance(10 * time.Minute)
	// Nothing could write it, so it is still there.
	if got := pullOne(t, c, sub.Name, 5*time.Second); got.Message.MessageId != ids[0] {
		t.Fatalf("pulled %v, want the message no export could write", got)
	}
}

// An update right after a create meets the exporter's first check of its
// destination, which logs the subscription's state: under -race this
// caught the log reading the subscription unlocked while the update
// replaced it.
func TestStorageExportUpdatedWhileChecked(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	for i := range 30 {
		sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60,
			CloudStorageConfig: &pb.CloudStorageConfig{Bucket: "some-bucket"}})
		_, err := c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: sub.Name, CloudStorageConfig: &pb.CloudStorageConfig{Bucket: "other-bucket"}},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"cloud_storage_config"}}})
		if err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		waitStorageState(t, c, sub.Name, pb.CloudStorageConfig_NOT_FOUND)
	}
}

func TestStorageConfigChecks(t *testing.T) {
	c := newClient(t, startOurs(t, Options{}).addr)
	topic := createTopic(t, c)
	cfg := func(f func(*pb.CloudStorageConfig)) *pb.CloudStorageConfig {
		sc := &pb.CloudStorageConfig{Bucket: "my-bucket"}
		f(sc)
		return sc
	}
	for _, tc := range []struct {
		name string
		sub  *pb.Subscription
		msg  string
	}{
		{"no bucket", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.Bucket = "" })}, "bucket is required"},
		{"gs:// bucket", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.Bucket = "gs://b-1" })}, "without gs://"},
		{"bad bucket", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.Bucket = "Upper" })}, "not a valid bucket name"},
		{"suffix /", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.FilenameSuffix = "a/" })}, "must not end in /"},
		{"bad datetime", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.FilenameDatetimeFormat = "YYYY.MM" })}, `unexpected ".MM"`},
		{"datetime twice", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.FilenameDatetimeFormat = "YYYY-YYYY" })}, "YYYY appears twice"},
		{"short duration", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.MaxDuration = durationpb.New(30 * time.Second) })}, "max_duration is 30s"},
		{"long duration", &pb.Subscription{AckDeadlineSeconds: 600, CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.MaxDuration = durationpb.New(11 * time.Minute) })}, "max_duration is 11m0s"},
		{"duration over the ack deadline", &pb.Subscription{AckDeadlineSeconds: 60, CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.MaxDuration = durationpb.New(2 * time.Minute) })}, "must not exceed the subscription's ack deadline"},
		{"few bytes", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.MaxBytes = 999 })}, "max_bytes is 999"},
		{"few messages", &pb.Subscription{CloudStorageConfig: cfg(func(c *pb.CloudStorageConfig) { c.MaxMessages = 999 })}, "max_messages is 999"},
		{"push and storage", &pb.Subscription{PushConfig: &pb.PushConfig{PushEndpoint: "http://127.0.0.1:1/"}, CloudStorageConfig: cfg(func(*pb.CloudStorageConfig) {})}, "at most one of"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.sub.Name, tc.sub.Topic = subName(unique("s")), topic
			_, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), tc.sub)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.msg) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.msg)
			}
		})
	}
}

// A batch whose write fails goes back in order: once the bucket is there
// again, an ordering key's messages are written as they were published.
func TestStorageExportRetryKeepsOrder(t *testing.T) {
	host, client, bucket := storageServer(t)
	tg := startOurs(t, Options{Exports: ExportOptions{StorageHost: host}})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 600, EnableMessageOrdering: true,
		CloudStorageConfig: &pb.CloudStorageConfig{Bucket: bucket, MaxBytes: 1000, MaxDuration: durationpb.New(time.Minute)}})
	// A first object shows the exporter writing; then the bucket goes.
	publish(t, c, topic, &pubsub.Message{Data: bytes.Repeat([]byte("x"), 1000)})
	names, _ := objects(t, client, bucket, "", 1)
	backlogEmpty(t, tg.ours, sub(tg, topic)) // its lease gone, so the one leased below is a new message's
	ctx := context.Background()
	if err := client.Bucket(bucket).Object(names[0]).Delete(ctx); err != nil {
		t.Fatal(err)
	}
	if err := client.Bucket(bucket).Delete(ctx); err != nil {
		t.Fatal(err)
	}
	p := c.Publisher(topic)
	p.EnableMessageOrdering = true
	var want strings.Builder
	for i := range 5 {
		line := fmt.Sprintf("m%d%s", i, strings.Repeat(".", 50))
		want.WriteString(line + "\n")
		if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte(line), OrderingKey: "k"}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	p.Stop()
	leased(t, tg.ours, sub(tg, topic), 1) // in the batch before the clock moves
	tg.clock.Advance(61 * time.Second)    // max_duration: the write fails, the batch goes back
	waitStorageState(t, c, sub(tg, topic), pb.CloudStorageConfig_NOT_FOUND)
	if err := client.Bucket(bucket).Create(ctx, "p", nil); err != nil {
		t.Fatal(err)
	}
	waitStorageState(t, c, sub(tg, topic), pb.CloudStorageConfig_ACTIVE)
	leased(t, tg.ours, sub(tg, topic), 1) // a key's messages are leased in one run
	tg.clock.Advance(61 * time.Second)
	_, contents := objects(t, client, bucket, "", 1)
	if got := string(bytes.Join(contents, nil)); got != want.String() {
		t.Errorf("after the bucket came back, objects hold\n%s\nwant the key's messages in order\n%s", got, want.String())
	}
}

// sub is the name of the topic's one subscription.
// leased waits until the exporter of sub holds n messages in its batch
// (leased to it), so that a move of the clock finds them there.
func leased(t *testing.T, b *Broker, sub string, n int) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(10 * time.Millisecond) {
		b.mu.Lock()
		got := 0
		for _, l := range b.subs[sub].leases {
			if !l.backoff {
				got++
			}
		}
		b.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("subscription %s: %d messages leased to its exporter, want %d", sub, got, n)
		}
	}
}

func sub(tg target, topic string) string {
	tg.ours.mu.Lock()
	defer tg.ours.mu.Unlock()
	for _, s := range tg.ours.topics[topic].subs {
		return s.proto.Name
	}
	return ""
}
