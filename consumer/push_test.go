package consumer_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/store/mem"
	"github.com/dedupflow/dedupflow/store/redis"
)

// pushBody is the wrapped JSON body Pub/Sub posts for one message.
func pushBody(id, data string, attrs map[string]string) []byte {
	b, _ := json.Marshal(map[string]any{
		"message": map[string]any{
			"data": base64.StdEncoding.EncodeToString([]byte(data)), "attributes": attrs,
			"messageId": id, "message_id": id, "publishTime": time.Now().UTC().Format(time.RFC3339Nano),
		},
		"subscription": "projects/p/subscriptions/s",
	})
	return b
}

func post(t *testing.T, h http.Handler, body []byte) int {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
	return rec.Code
}

// seen records what next was called with.
type seen struct {
	mu   sync.Mutex
	data []string
	keys []string
}

func (s *seen) handler(status func(n int) int) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, ok := consumer.MessageFrom(r.Context())
		k, _ := consumer.KeyFromContext(r.Context())
		s.mu.Lock()
		n := len(s.data)
		if ok {
			s.data = append(s.data, string(m.Data))
			s.keys = append(s.keys, k)
		}
		s.mu.Unlock()
		w.WriteHeader(status(n))
	})
}

func (s *seen) get() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.data...)
}

func always(code int) func(int) int { return func(int) int { return code } }

// The seed's scenario as push requests: Message 2, 3 and 4 carry key 456;
// only Message 2 reaches next, the others answer 204 and are counted as
// republishes; a redelivery of Message 2 is counted as one.
func TestPushSeedScenario(t *testing.T) {
	var s seen
	h, err := consumer.PushHandler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, s.handler(always(http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	if c := post(t, h, pushBody("1", "Message 1", map[string]string{"key": "123"})); c != http.StatusOK {
		t.Fatalf("Message 1 answered %d", c)
	}
	for i, id := range []string{"2", "3", "4", "2"} {
		want := http.StatusNoContent
		if i == 0 {
			want = http.StatusOK
		}
		if c := post(t, h, pushBody(id, "Message "+id, map[string]string{"key": "456"})); c != want {
			t.Fatalf("message %s answered %d, want %d", id, c, want)
		}
	}
	if got := s.get(); fmt.Sprint(got) != "[Message 1 Message 2]" {
		t.Fatalf("next saw %v, want Message 1 and Message 2", got)
	}
	if s.keys[1] != "456" {
		t.Errorf("key in next's context %q, want 456", s.keys[1])
	}
}

// A next that fails twice and then succeeds: the key is committed only on
// the success, so the third delivery runs next again and the fourth is a
// redelivery answered 204.
func TestPushFailsTwiceThenSucceeds(t *testing.T) {
	var s seen
	h, err := consumer.PushHandler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}},
		s.handler(func(n int) int {
			return map[bool]int{true: http.StatusInternalServerError, false: http.StatusAccepted}[n < 2]
		}))
	if err != nil {
		t.Fatal(err)
	}
	body := pushBody("7", "x", map[string]string{"key": "k"})
	for i, want := range []int{500, 500, 202, 204} {
		if c := post(t, h, body); c != want {
			t.Fatalf("delivery %d answered %d, want %d", i+1, c, want)
		}
	}
	if n := len(s.get()); n != 3 {
		t.Fatalf("next ran %d times, want 3 (two failures, one success)", n)
	}
}

// Bodies that are not push requests answer 400 and never reach next.
func TestPushBadRequests(t *testing.T) {
	var s seen
	h, err := consumer.PushHandler(mem.New(), consumer.Options{}, s.handler(always(http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	for name, body := range map[string]string{
		"not JSON":        "hello",
		"no message":      `{"subscription":"projects/p/subscriptions/s"}`,
		"bad base64":      `{"message":{"data":"!!!","messageId":"1"},"subscription":"s"}`,
		"no message ID":   `{"message":{"data":"aGk="},"subscription":"s"}`,
		"message not obj": `{"message":"hi"}`,
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)))
			if rec.Code != http.StatusBadRequest {
				t.Fatalf("answered %d, want 400", rec.Code)
			}
			if name == "bad base64" && !strings.Contains(rec.Body.String(), "base64") {
				t.Errorf("answer %q does not name the base64", rec.Body.String())
			}
		})
	}
	if n := len(s.get()); n != 0 {
		t.Fatalf("next ran %d times for bad requests", n)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
	if rec.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET answered %d, want 405", rec.Code)
	}
}

// An unwrapped push with write_metadata: the data is the body, the message
// ID and attributes are headers (their names without case).
func TestPushUnwrapped(t *testing.T) {
	var s seen
	h, err := consumer.PushHandler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id"}}, s.handler(always(http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	send := func(id string) int {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader("raw "+id))
		r.Header.Set("x-goog-pubsub-message-id", id)
		r.Header.Set("x-goog-pubsub-publish-time", time.Now().UTC().Format(time.RFC3339Nano))
		r.Header.Set("event_id", "e-1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		return rec.Code
	}
	if a, b := send("10"), send("11"); a != 200 || b != 204 {
		t.Fatalf("answers %d, %d; want 200 then 204 for the republish", a, b)
	}
	if got := s.get(); fmt.Sprint(got) != "[raw 10]" || s.keys[0] != "e-1" {
		t.Fatalf("next saw %v with keys %v", got, s.keys)
	}
}

// A copy whose original is being handled by another replica right now
// answers 429, so Pub/Sub backs off and brings it back; it is then a
// duplicate.
func TestPushInFlightAnswers429(t *testing.T) {
	st := mem.New()
	release := make(chan struct{})
	var s seen
	slow, err := consumer.PushHandler(st, consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
		s.handler(always(http.StatusOK)).ServeHTTP(w, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	other, err := consumer.PushHandler(st, consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, s.handler(always(http.StatusOK)))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan int)
	go func() { done <- post(t, slow, pushBody("1", "first", map[string]string{"key": "k"})) }()
	// The first replica holds the key once its claim is in the store.
	for st.Len() == 0 {
		time.Sleep(time.Millisecond)
	}
	if c := post(t, other, pushBody("2", "copy", map[string]string{"key": "k"})); c != http.StatusTooManyRequests {
		t.Fatalf("copy during the first's handling answered %d, want 429", c)
	}
	close(release)
	if c := <-done; c != http.StatusOK {
		t.Fatalf("first answered %d", c)
	}
	if c := post(t, other, pushBody("2", "copy", map[string]string{"key": "k"})); c != http.StatusNoContent {
		t.Fatalf("copy after the first answered %d, want 204", c)
	}
}

// Through real push subscriptions of Google's emulator and of our broker:
// the seed scenario end to end, and a next that is slow past the ack
// deadline once, so the message is pushed again and caught as a
// redelivery.
func TestPushThroughServers(t *testing.T) {
	testenv.EmulatorAndOurs(t, brokertest.Ours, pushSeedAndSlow)
}

func pushSeedAndSlow(t *testing.T, host string) {
	ctx := context.Background()
	c, err := pubsubio.NewClient(ctx, "push-test", pubsubio.Insecure(host)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var s seen
	var slowOnce atomic.Bool
	h, err := consumer.PushHandler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, _ := consumer.MessageFrom(r.Context())
		if string(m.Data) == "slow" && slowOnce.CompareAndSwap(false, true) {
			time.Sleep(12 * time.Second) // past the 10 s ack deadline: pushed again
		}
		s.handler(always(http.StatusOK)).ServeHTTP(w, r)
	}))
	if err != nil {
		t.Fatal(err)
	}
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	id := fmt.Sprintf("push-%d", time.Now().UnixNano())
	topic, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/push-test/topics/" + id})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/push-test/subscriptions/" + id, Topic: topic.Name, AckDeadlineSeconds: 10,
		PushConfig: &pubsubpb.PushConfig{PushEndpoint: srv.URL + "/push"},
	}); err != nil {
		t.Fatal(err)
	}
	pub := c.Publisher(topic.Name)
	t.Cleanup(pub.Stop)
	for _, m := range []struct{ data, key string }{{"Message 1", "123"}, {"Message 2", "456"}, {"Message 3", "456"}, {"Message 4", "456"}, {"slow", "789"}} {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte(m.data), Attributes: map[string]string{"key": m.key}}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(s.get()) < 3 || requests.Load() < 6 { // five messages, and the slow one pushed again
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s next saw %v in %d requests", s.get(), requests.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The slow message's first call outlived its ack deadline, so it was
	// pushed again meanwhile; that copy waited for the first call (the
	// same key, in this process), then found the key done: a redelivery,
	// answered 204 without calling next. Of Messages 2, 3 and 4 (one key),
	// the first pushed reaches it, the others never: a server may push
	// them in any order, and does under load.
	n := map[string]int{}
	for _, d := range s.get() {
		n[d]++
	}
	if n["Message 1"] != 1 || n["Message 2"]+n["Message 3"]+n["Message 4"] != 1 || n["slow"] != 1 {
		t.Fatalf("next saw %v", s.get())
	}
}

// Three replicas of the handler share one Redis; every key is pushed to
// all three at once: each key succeeds exactly once.
func TestPushReplicasShareRedis(t *testing.T) {
	url := testenv.RedisURL(t)
	prefix := fmt.Sprintf("dedupflow-push-test:%d:", time.Now().UnixNano())
	var ok sync.Map
	var replicas []http.Handler
	for range 3 {
		st, err := redis.Open(context.Background(), url, redis.Options{Prefix: prefix, Logger: testenv.Logger()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		h, err := consumer.PushHandler(st, consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			k, _ := consumer.KeyFromContext(r.Context())
			n, _ := ok.LoadOrStore(k, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			time.Sleep(2 * time.Millisecond)
		}))
		if err != nil {
			t.Fatal(err)
		}
		replicas = append(replicas, h)
	}
	const keys = 30
	var wg sync.WaitGroup
	for i := range keys {
		for j, h := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body := pushBody(fmt.Sprintf("%d-%d", i, j), "x", map[string]string{"key": fmt.Sprint("k", i)})
				// As Pub/Sub does: a 429 or a 5xx comes back.
				for try := 0; try < 50 && post(t, h, body)/100 != 2; try++ {
					time.Sleep(20 * time.Millisecond)
				}
			}()
		}
	}
	wg.Wait()
	for i := range keys {
		n, _ := ok.Load(fmt.Sprint("k", i))
		if n == nil || n.(*atomic.Int32).Load() != 1 {
			t.Fatalf("key k%d succeeded %v times, want once", i, n)
		}
	}
}
