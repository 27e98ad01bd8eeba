package publisher_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/google/uuid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// The contract: an attempt that fails after the server stored the message
// is retried with the same key, so the two stored copies have different
// message IDs and one key — a republish the pipeline drops.
func TestRetryAfterStoredMessageKeepsKey(t *testing.T) {
	srv, front, addr := newLossy(t, 1)
	c := newClient(t, addr, false)
	topic, pub := newTopic(t, c)
	var sl sleeps
	var logs bytes.Buffer
	p, err := publisher.New(pub, publisher.Options{
		Sleep:  sl.Sleep,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := p.Publish(ctx, publisher.Event{Data: []byte("hello")})
	key := r.Key()
	if u, err := uuid.Parse(key); err != nil || u.Version() != 7 {
		t.Fatalf("generated key %q is not a UUIDv7 (%v)", key, err)
	}
	id, err := r.Get(ctx)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	if r.Attempts() != 2 || front.Requests() != 2 {
		t.Errorf("attempts %d, requests %d; want 2 and 2", r.Attempts(), front.Requests())
	}
	msgs := stored(srv, topic)
	if len(msgs) != 2 {
		t.Fatalf("server stored %d messages, want 2 (the lost one and the retry)", len(msgs))
	}
	if msgs[0].ID == msgs[1].ID {
		t.Errorf("both copies have message ID %s; a retry is a new message", msgs[0].ID)
	}
	for i, m := range msgs {
		if got := m.Attributes[publisher.DefaultIDAttribute]; got != key {
			t.Errorf("copy %d has %s=%q, want the key %q", i, publisher.DefaultIDAttribute, got, key)
		}
		if string(m.Data) != "hello" {
			t.Errorf("copy %d data %q", i, m.Data)
		}
	}
	if id != msgs[1].ID {
		t.Errorf("Get returned %s, want the ID of the attempt that succeeded, %s", id, msgs[1].ID)
	}
	if d := sl.get(); len(d) != 1 || d[0] < 50*time.Millisecond || d[0] > 100*time.Millisecond {
		t.Errorf("backoff pauses %v, want one in [50ms, 100ms]", d)
	}
	if !strings.Contains(logs.String(), key) || !strings.Contains(logs.String(), "retrying with the same key") {
		t.Errorf("no retry log line naming the key:\n%s", logs.String())
	}
}

// The official client retries a lost response itself and stores a second
// copy with a new message ID; since the key was stamped before the first
// attempt, that copy carries it too.
func TestClientRetryAfterStoredMessageKeepsKey(t *testing.T) {
	srv, front, addr := newLossy(t, 1)
	c := newClient(t, addr, true)
	topic, pub := newTopic(t, c)
	p, err := publisher.New(pub, publisher.Options{IDAttribute: "order_key"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := p.Publish(ctx, publisher.Event{Key: "order-123", Data: []byte("paid")})
	if _, err := r.Get(ctx); err != nil {
		t.Fatal(err)
	}
	msgs := stored(srv, topic)
	if len(msgs) != 2 || front.Requests() != 2 {
		t.Fatalf("%d stored, %d requests; want 2 and 2", len(msgs), front.Requests())
	}
	if msgs[0].ID == msgs[1].ID || msgs[0].Attributes["order_key"] != "order-123" || msgs[1].Attributes["order_key"] != "order-123" {
		t.Errorf("copies %s %v and %s %v: want new IDs, one key", msgs[0].ID, msgs[0].Attributes, msgs[1].ID, msgs[1].Attributes)
	}
	if r.Attempts() != 1 {
		t.Errorf("publisher attempts %d: the client's retry should have been enough", r.Attempts())
	}
}

func TestGivesUpNamingKeyAndAttempts(t *testing.T) {
	srv := pstest.NewServer(pstest.WithErrorInjection("Publish", codes.Unavailable, "test: down"))
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, srv.Addr, false)
	_, pub := newTopic(t, c)
	var sl sleeps
	p, err := publisher.New(pub, publisher.Options{MaxAttempts: 3, Sleep: sl.Sleep,
		Backoff: publisher.Backoff{Initial: time.Second, Max: 1500 * time.Millisecond, Multiplier: 2}})
	if err != nil {
		t.Fatal(err)
	}
	r := p.Publish(context.Background(), publisher.Event{Key: "k-1", Data: []byte("x")})
	_, err = r.Get(context.Background())
	var pe *publisher.PublishError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T), want a *PublishError", err, err)
	}
	if pe.Key != "k-1" || pe.Attempts != 3 || !pe.GaveUp || status.Code(err) != codes.Unavailable ||
		pe.IDAttribute != publisher.DefaultIDAttribute || pe.KeyAttribute != pe.IDAttribute {
		t.Errorf("got %+v (code %v)", pe, status.Code(err))
	}
	for _, want := range []string{`key="k-1"`, "gave up after 3 attempts", "test: down"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	// Pauses: 1s then 2s capped to 1.5s, each jittered into [d/2, d].
	d := sl.get()
	if len(d) != 2 || d[0] < 500*time.Millisecond || d[0] > time.Second || d[1] < 750*time.Millisecond || d[1] > 1500*time.Millisecond {
		t.Errorf("pauses %v", d)
	}
	if again, err2 := r.Get(context.Background()); again != "" || err2 != err {
		t.Errorf("second Get: %q, %v; want the same final error", again, err2)
	}
}

func TestNotRetryableFailsAtOnce(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, srv.Addr, true)
	pub := c.Publisher(pubsubio.Name{Project: project, Kind: "topics", ID: "no-such-topic"}.String())
	t.Cleanup(pub.Stop)
	var sl sleeps
	p, _ := publisher.New(pub, publisher.Options{Sleep: sl.Sleep})
	_, err := p.Publish(context.Background(), publisher.Event{Key: "k", Data: []byte("x")}).Get(context.Background())
	var pe *publisher.PublishError
	if !errors.As(err, &pe) || pe.Attempts != 1 || pe.GaveUp || status.Code(err) != codes.NotFound {
		t.Fatalf("got %v, want a non-retryable NotFound after 1 attempt", err)
	}
	if len(sl.get()) != 0 {
		t.Errorf("slept %v before a non-retryable error", sl.get())
	}
}

func TestInvalidEventsAreNeverSent(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, srv.Addr, true)
	topic, pub := newTopic(t, c)
	p, err := publisher.New(pub, publisher.Options{TimestampAttribute: "ts"})
	if err != nil {
		t.Fatal(err)
	}
	attrs := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m["a"+strconv.Itoa(i)] = "v"
		}
		return m
	}
	for _, tc := range []struct {
		name string
		e    publisher.Event
		want error
	}{
		{"empty", publisher.Event{Key: "k"}, publisher.ErrEmptyEvent},
		// 98 of the caller's, the key and the timestamp: 100 is allowed.
		{"too many attributes", publisher.Event{Key: "k", Attributes: attrs(99)}, publisher.ErrTooManyAttributes},
		{"key too long", publisher.Event{Key: strings.Repeat("k", 1025), Data: []byte("x")}, publisher.ErrKeyTooLong},
		{"key not UTF-8", publisher.Event{Key: "k\xff", Data: []byte("x")}, publisher.ErrNotUTF8},
		{"attribute name too long", publisher.Event{Key: "k", Attributes: map[string]string{strings.Repeat("n", 257): "v"}}, publisher.ErrAttributeName},
		{"empty attribute name", publisher.Event{Key: "k", Attributes: map[string]string{"": "v"}}, publisher.ErrAttributeName},
		{"reserved attribute name", publisher.Event{Key: "k", Attributes: map[string]string{"googclient_x": "v"}}, limits.ErrAttributeKey},
		{"value not UTF-8", publisher.Event{Key: "k", Attributes: map[string]string{"a": "\xc3\x28"}}, publisher.ErrNotUTF8},
		{"value too long", publisher.Event{Key: "k", Attributes: map[string]string{"a": strings.Repeat("v", 1025)}}, publisher.ErrAttributeValue},
		{"two keys", publisher.Event{Key: "k", Attributes: map[string]string{"key": "other"}}, publisher.ErrKeyConflict},
		{"two timestamps", publisher.Event{Key: "k", Time: time.Unix(1, 0), Attributes: map[string]string{"ts": "5"}}, publisher.ErrTimestampConflict},
		{"too large", publisher.Event{Key: "k", Data: make([]byte, limits.MessageBytes)}, limits.ErrTooLarge},
		// The service counts the ordering key too.
		{"too large with the ordering key", publisher.Event{Key: "k", Data: make([]byte, limits.MessageBytes-30), OrderingKey: strings.Repeat("o", 30)}, limits.ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := p.Publish(context.Background(), tc.e)
			select {
			case <-r.Ready():
			default:
				t.Fatal("an invalid event's result is not ready at once")
			}
			_, err := r.Get(context.Background())
			if !errors.Is(err, publisher.ErrInvalidEvent) || !errors.Is(err, tc.want) {
				t.Fatalf("error %v, want ErrInvalidEvent and %v", err, tc.want)
			}
			if r.Attempts() != 0 {
				t.Errorf("%d attempts sent", r.Attempts())
			}
			if !utf8.ValidString(err.Error()) {
				t.Errorf("error message is not UTF-8: %q", err)
			}
		})
	}
	// The limits are inclusive: 100 attributes in all is fine.
	if _, err := p.Publish(context.Background(), publisher.Event{Key: "k", Attributes: attrs(98)}).Get(context.Background()); err != nil {
		t.Errorf("100 attributes: %v", err)
	}
	if n := len(stored(srv, topic)); n != 1 {
		t.Errorf("server holds %d messages, want only the valid one", n)
	}
}

func TestKeyAndTimestampStampedOnce(t *testing.T) {
	srv := pstest.NewServer()
	t.Cleanup(func() { srv.Close() })
	c := newClient(t, srv.Addr, true)
	topic, pub := newTopic(t, c)
	now := time.UnixMilli(1_700_000_000_123)
	n := 0
	p, err := publisher.New(pub, publisher.Options{
		TimestampAttribute: "occurred_at",
		Now:                func() time.Time { return now },
		NewKey:             func() (string, error) { n++; return "gen-" + strconv.Itoa(n), nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	callerAttrs := map[string]string{"source": "web"}
	before := maps.Clone(callerAttrs)
	cases := []struct {
		e             publisher.Event
		key, occurred string
	}{
		{publisher.Event{Key: "order-1", Data: []byte("a"), Attributes: callerAttrs}, "order-1", "1700000000123"},
		{publisher.Event{Data: []byte("b"), Attributes: map[string]string{"key": "from-attr"}}, "from-attr", "1700000000123"},
		{publisher.Event{Data: []byte("c"), Time: time.UnixMilli(42)}, "gen-1", "42"},
		{publisher.Event{Data: []byte("d"), Attributes: map[string]string{"occurred_at": "2024-01-01T00:00:00Z"}}, "gen-2", "2024-01-01T00:00:00Z"},
		{publisher.Event{Key: "same", Attributes: map[string]string{"key": "same"}}, "same", "1700000000123"},
	}
	for _, tc := range cases {
		r := p.Publish(ctx, tc.e)
		if r.Key() != tc.key {
			t.Errorf("Key() %q, want %q", r.Key(), tc.key)
		}
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	msgs := stored(srv, topic)
	if len(msgs) != len(cases) {
		t.Fatalf("%d stored", len(msgs))
	}
	for i, m := range msgs {
		if m.Attributes["key"] != cases[i].key || m.Attributes["occurred_at"] != cases[i].occurred {
			t.Errorf("message %d attributes %v, want key=%s occurred_at=%s", i, m.Attributes, cases[i].key, cases[i].occurred)
		}
	}
	if !maps.Equal(callerAttrs, before) {
		t.Errorf("the caller's attribute map was changed: %v", callerAttrs)
	}
}

// A Get whose context ends during a backoff leaves the event pending; the
// next Get resumes it, still with the same key.
func TestGetResumesAfterContextEnds(t *testing.T) {
	srv, _, addr := newLossy(t, 1)
	c := newClient(t, addr, false)
	topic, pub := newTopic(t, c)
	var blocked sync.Once
	sleep := func(ctx context.Context, d time.Duration) error {
		first := false
		blocked.Do(func() { first = true })
		if first {
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	}
	p, _ := publisher.New(pub, publisher.Options{Sleep: sleep})
	r := p.Publish(context.Background(), publisher.Event{Data: []byte("x")})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := r.Get(ctx); !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), r.Key()) {
		t.Fatalf("first Get: %v, want a deadline naming the key", err)
	}
	select {
	case <-r.Ready():
		t.Fatal("result final after an interrupted Get")
	default:
	}
	// Several callers may wait on one result; they all get one answer.
	var wg sync.WaitGroup
	ids := make([]string, 4)
	for i := range ids {
		wg.Go(func() {
			id, err := r.Get(context.Background())
			if err != nil {
				t.Error(err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	msgs := stored(srv, topic)
	if len(msgs) != 2 || r.Attempts() != 2 {
		t.Fatalf("%d stored after %d attempts, want 2 and 2", len(msgs), r.Attempts())
	}
	for i, id := range ids {
		if id != msgs[1].ID {
			t.Errorf("Get %d returned %q, want %q", i, id, msgs[1].ID)
		}
	}
	if msgs[0].Attributes["key"] != r.Key() || msgs[1].Attributes["key"] != r.Key() {
		t.Errorf("keys %q, %q; want %q", msgs[0].Attributes["key"], msgs[1].Attributes["key"], r.Key())
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    publisher.Options
		want string
	}{
		{"long id attribute", publisher.Options{IDAttribute: strings.Repeat("k", 257)}, "id attribute"},
		{"reserved id attribute", publisher.Options{IDAttribute: "goog_key"}, "reserved by Pub/Sub"},
		{"both names, different", publisher.Options{IDAttribute: "a", KeyAttribute: "b"}, "set IDAttribute only"},
		{"reserved timestamp attribute", publisher.Options{TimestampAttribute: "GOOGts"}, "reserved by Pub/Sub"},
		{"timestamp is the id", publisher.Options{TimestampAttribute: "key"}, "also the id attribute"},
		{"negative attempts", publisher.Options{MaxAttempts: -1}, "at least 1"},
		{"max below initial", publisher.Options{Backoff: publisher.Backoff{Initial: time.Second, Max: time.Millisecond}}, "below the initial"},
		{"multiplier", publisher.Options{Backoff: publisher.Backoff{Multiplier: 0.5}}, "multiplier"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.o.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Validate: %v, want an error saying %q", err, tc.want)
			}
		})
	}
	var o publisher.Options
	if err := o.Validate(); err != nil || o.IDAttribute != "key" || o.MaxAttempts != publisher.DefaultMaxAttempts {
		t.Errorf("zero options: %v, %+v", err, o)
	}
	// The former name still works, alone or equal to the new one.
	for _, o := range []publisher.Options{{KeyAttribute: "event_id"}, {IDAttribute: "event_id", KeyAttribute: "event_id"}} {
		if err := o.Validate(); err != nil || o.IDAttribute != "event_id" {
			t.Errorf("%+v: %v, want id attribute event_id", o, err)
		}
	}
	if _, err := publisher.New(nil, publisher.Options{}); err == nil {
		t.Error("New(nil) succeeded")
	}
}

func TestBackoffPause(t *testing.T) {
	b := publisher.Backoff{Initial: 100 * time.Millisecond, Max: time.Second, Multiplier: 3}
	want := []time.Duration{100 * time.Millisecond, 300 * time.Millisecond, 900 * time.Millisecond, time.Second, time.Second}
	for i, w := range want {
		if got := b.Pause(i + 1); got != w {
			t.Errorf("Pause(%d) = %v, want %v", i+1, got, w)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, "x"), true},
		{status.Error(codes.DeadlineExceeded, "x"), true},
		{status.Error(codes.ResourceExhausted, "x"), true},
		{status.Error(codes.Aborted, "x"), true},
		{status.Error(codes.Internal, "x"), true},
		{status.Error(codes.Unknown, "x"), true},
		{status.Error(codes.Internal, "grpc: error while marshaling: string field contains invalid UTF-8"), false},
		{status.Error(codes.InvalidArgument, "x"), false},
		{status.Error(codes.NotFound, "x"), false},
		{status.Error(codes.PermissionDenied, "x"), false},
		{context.DeadlineExceeded, true},
		{context.Canceled, false},
		{errors.New("pubsub: Stop has been called for this publisher"), false},
		{nil, false},
	} {
		if got := publisher.Retryable(tc.err); got != tc.want {
			t.Errorf("Retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
