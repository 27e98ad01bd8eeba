package broker

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/base64"
	"encoding/json"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/golang-jwt/jwt/v5"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// TestPushPullSwitch switches one subscription from pull to push and back
// with ModifyPushConfig and UpdateSubscription.
func TestPushPullSwitch(t *testing.T) {
	forEachTargetWith(t, realClock, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		ctx := context.Background()
		e := newEndpoint(t, always(http.StatusOK))
		topic := createTopic(t, c)
		sub := pushSub(t, tg, c, &pb.Subscription{Topic: topic})
		pullAck := func(data string) {
			t.Helper()
			publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte(data)})
			m := pullOne(t, c, sub.Name, 30*time.Second)
			if string(m.Message.Data) != data {
				t.Fatalf("pulled %q, want %q", m.Message.Data, data)
			}
			if err := c.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub.Name, AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
		}
		pushed := func(data string) {
			t.Helper()
			publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte(data)})
			if w := decodeWrapped(t, e.next(t, 30*time.Second)); string(w.Message.Data) != data {
				t.Fatalf("pushed %q, want %q", w.Message.Data, data)
			}
		}
		endpointIs := func(want string) {
			t.Helper()
			got, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub.Name})
			if err != nil || got.PushConfig.GetPushEndpoint() != want {
				t.Fatalf("subscription after the switch: %v %v, want endpoint %q", got, err, want)
			}
		}

		pullAck("pulled first")
		if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: sub.Name,
			PushConfig: &pb.PushConfig{PushEndpoint: e.URL}}); err != nil {
			t.Fatal(err)
		}
		endpointIs(e.URL)
		pushed("pushed")
		if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: sub.Name, PushConfig: &pb.PushConfig{}}); err != nil {
			t.Fatal(err)
		}
		endpointIs("")
		pullAck("pulled again") // the pull got it, so no push did
		if _, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: sub.Name, PushConfig: &pb.PushConfig{PushEndpoint: e.URL + "/updated"}},
			UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"push_config"}}}); err != nil {
			t.Fatal(err)
		}
		endpointIs(e.URL + "/updated")
		pushed("pushed after update")
	})
}

// TestPushSlowEndpoint: an endpoint that never answers fills only its own
// subscription's window; another push subscription of the same topic gets
// everything meanwhile, and Close does not wait for the hanging requests.
func TestPushSlowEndpoint(t *testing.T) {
	forEachTargetWith(t, realClock, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		slow, fast := newEndpoint(t, always(0)), newEndpoint(t, always(http.StatusOK))
		topic := createTopic(t, c)
		slowSub := pushSub(t, tg, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 60, PushConfig: &pb.PushConfig{PushEndpoint: slow.URL}})
		pushSub(t, tg, c, &pb.Subscription{Topic: topic, PushConfig: &pb.PushConfig{PushEndpoint: fast.URL}})
		var msgs []*pb.PubsubMessage
		for i := range 50 {
			msgs = append(msgs, &pb.PubsubMessage{Data: []byte{byte(i)}})
		}
		ids := publishPB(t, c, topic, msgs...)
		got := map[string]bool{}
		for len(got) < len(ids) {
			got[decodeWrapped(t, fast.next(t, 30*time.Second)).Message.MessageID] = true
		}
		slow.next(t, 30*time.Second)
		if tg.ours == nil {
			return
		}
		// Nothing came back from the slow endpoint, so its window is still
		// the starting one: that many messages are leased, no more.
		b := tg.ours
		b.mu.Lock()
		leased := len(b.subs[slowSub.Name].leases)
		b.mu.Unlock()
		if leased != pushStartWindow {
			t.Errorf("%d messages outstanding at a silent endpoint, want the starting window %d", leased, pushStartWindow)
		}
		if err := b.Close(); err != nil {
			t.Errorf("close with pushes in flight: %v", err)
		}
	})
}

func TestPushWindow(t *testing.T) {
	p := &pusher{window: pushStartWindow}
	for range 10 {
		p.inFlight++
		p.settle(pushAcked)
	}
	if p.window != pushStartWindow+10 {
		t.Errorf("window %d after 10 acks, want %d", p.window, pushStartWindow+10)
	}
	p.inFlight++
	p.settle(pushFailed)
	if p.window != (pushStartWindow+10)/2 {
		t.Errorf("window %d after a failure, want it halved to %d", p.window, (pushStartWindow+10)/2)
	}
	for range 10 {
		p.inFlight++
		p.settle(pushFailed)
	}
	p.inFlight++
	p.settle(pushSkipped)
	if p.window != 1 || p.inFlight != 0 {
		t.Errorf("window %d, in flight %d after failures; want 1 and 0", p.window, p.inFlight)
	}
	for range 2 * pushMaxWindow {
		p.inFlight++
		p.settle(pushAcked)
	}
	if p.window != pushMaxWindow {
		t.Errorf("window %d, want at most %d", p.window, pushMaxWindow)
	}
}

// TestPushOIDC verifies the bearer token as a handler would: with the
// broker's public key, from the accessor and from the key set. The emulator
// sends no token, so this runs against ours only.
func TestPushOIDC(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	for _, given := range []*rsa.PrivateKey{nil, key} {
		tg := startOurs(t, Options{Now: time.Now, PushKey: given})
		c := newClient(t, tg.addr)
		e := newEndpoint(t, always(http.StatusOK))
		topic := createTopic(t, c)
		const email = "pusher@my-project.iam.gserviceaccount.com"
		pushSub(t, tg, c, &pb.Subscription{Topic: topic, PushConfig: &pb.PushConfig{PushEndpoint: e.URL + "/a",
			AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: email, Audience: "my-audience"}}}})
		pushSub(t, tg, c, &pb.Subscription{Topic: topic, PushConfig: &pb.PushConfig{PushEndpoint: e.URL + "/b",
			AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: email}}}})
		publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("x")})

		pub, kid, err := tg.ours.PushPublicKey()
		if err != nil {
			t.Fatal(err)
		}
		if given != nil && !pub.Equal(&given.PublicKey) {
			t.Error("PushPublicKey is not the public half of Options.PushKey")
		}
		fromSet := keyFromSet(t, tg.addr, kid)
		if !fromSet.Equal(pub) {
			t.Error("the key set's key differs from PushPublicKey")
		}
		for range 2 {
			p := e.next(t, 30*time.Second)
			aud := "my-audience"
			if p.uri == "/b" {
				aud = e.URL + "/b" // the default audience is the endpoint
			}
			tok, ok := strings.CutPrefix(p.header.Get("Authorization"), "Bearer ")
			if !ok {
				t.Fatalf("push to %s without a bearer token: %v", p.uri, p.header)
			}
			var claims struct {
				Email         string `json:"email"`
				EmailVerified bool   `json:"email_verified"`
				jwt.RegisteredClaims
			}
			parsed, err := jwt.ParseWithClaims(tok, &claims, func(tk *jwt.Token) (any, error) {
				if tk.Header["kid"] != kid {
					t.Errorf("token kid %v, want %s", tk.Header["kid"], kid)
				}
				return fromSet, nil
			}, jwt.WithValidMethods([]string{"RS256"}), jwt.WithAudience(aud), jwt.WithIssuer(PushTokenIssuer),
				jwt.WithIssuedAt(), jwt.WithExpirationRequired())
			if err != nil || !parsed.Valid {
				t.Fatalf("token for %s does not verify: %v", p.uri, err)
			}
			if claims.Email != email || !claims.EmailVerified || claims.ExpiresAt.Sub(claims.IssuedAt.Time) != time.Hour {
				t.Errorf("claims %+v: want email %s, verified, valid for an hour", claims, email)
			}
			var raw map[string]any
			payload, _ := base64.RawURLEncoding.DecodeString(strings.Split(tok, ".")[1])
			if err := json.Unmarshal(payload, &raw); err != nil || raw["aud"] != aud {
				t.Errorf("aud %v, want the single string %q as in Google's tokens", raw["aud"], aud)
			}
		}
	}
}

// keyFromSet reads the key with kid from the key set the broker serves on
// its port, as a handler under test would fetch it.
func keyFromSet(t *testing.T, addr, kid string) *rsa.PublicKey {
	t.Helper()
	resp, err := http.Get("http://" + addr + PushKeysPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var set struct {
		Keys []struct{ Kty, Alg, Kid, N, E string }
	}
	if err := json.Unmarshal(body, &set); err != nil || len(set.Keys) != 1 || set.Keys[0].Kid != kid || set.Keys[0].Alg != "RS256" {
		t.Fatalf("key set %s: %v", body, err)
	}
	n, err1 := base64.RawURLEncoding.DecodeString(set.Keys[0].N)
	e, err2 := base64.RawURLEncoding.DecodeString(set.Keys[0].E)
	if err1 != nil || err2 != nil {
		t.Fatalf("key set %s: n %v, e %v", body, err1, err2)
	}
	return &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(e).Int64())}
}

// TestPushConfigKill9: push configurations, created or switched to with
// ModifyPushConfig, survive kill -9, and delivery resumes after the restart.
func TestPushConfigKill9(t *testing.T) {
	var acking atomic.Bool
	answer := func(int, pushed) int {
		if acking.Load() {
			return http.StatusOK
		}
		return http.StatusServiceUnavailable
	}
	created, modified := newEndpoint(t, answer), newEndpoint(t, answer)
	bin, dir := buildBrokerd(t), t.TempDir()
	cmd, addr := startBrokerd(t, bin, dir)
	c := newClient(t, addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	full := &pb.PushConfig{PushEndpoint: created.URL + "/p?q=1", Attributes: map[string]string{"x-goog-version": "v1"},
		Wrapper:              &pb.PushConfig_NoWrapper_{NoWrapper: &pb.PushConfig_NoWrapper{WriteMetadata: true}},
		AuthenticationMethod: &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{ServiceAccountEmail: "a@p.iam.gserviceaccount.com", Audience: "aud"}}}
	s1 := createSub(t, c, &pb.Subscription{Topic: topic, PushConfig: full})
	s2 := createSub(t, c, &pb.Subscription{Topic: topic})
	if err := c.SubscriptionAdminClient.ModifyPushConfig(ctx, &pb.ModifyPushConfigRequest{Subscription: s2.Name,
		PushConfig: &pb.PushConfig{PushEndpoint: modified.URL}}); err != nil {
		t.Fatal(err)
	}
	id := publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("survivor"), Attributes: map[string]string{"k": "v"}})[0]
	created.next(t, 10*time.Second) // nacked: the message stays
	modified.next(t, 10*time.Second)
	kill9(t, cmd)
	c.Close()
	for _, e := range []*endpoint{created, modified} {
		for len(e.got) > 0 {
			<-e.got
		}
	}
	acking.Store(true)

	cmd, addr = startBrokerd(t, bin, dir)
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			t.Errorf("broker exit: %v", err)
		}
	}()
	c2 := newClient(t, addr)
	for name, want := range map[string]*pb.PushConfig{s1.Name: full, s2.Name: {PushEndpoint: modified.URL}} {
		got, err := c2.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: name})
		if err != nil || !proto.Equal(got.PushConfig, want) {
			t.Errorf("push config after kill -9: %v %v, want %v", got.GetPushConfig(), err, want)
		}
	}
	p := created.next(t, 30*time.Second)
	if string(p.body) != "survivor" || p.header.Get(hdrMessageID) != id || p.header.Get("K") != "v" ||
		!strings.HasPrefix(p.header.Get("Authorization"), "Bearer ") || p.uri != "/p?q=1" {
		t.Errorf("push after restart: %s %q %v, want the raw data with metadata and a token", p.uri, p.body, p.header)
	}
	if w := decodeWrapped(t, modified.next(t, 30*time.Second)); w.Message.MessageID != id {
		t.Errorf("push after restart: message %s, want %s", w.Message.MessageID, id)
	}
}

// TestPushOrdering: an ordered push subscription has one message of a key
// at the endpoint at a time, and after a nack it redelivers that message
// before any later one of its key. The endpoint nacks every message once.
func TestPushOrdering(t *testing.T) {
	t.Parallel()
	forEachTargetWith(t, realClock, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		const keys, perKey = 3, 10
		var mu sync.Mutex
		seen := map[string]int{}
		inFlight := map[string]int{}
		acked := map[string][]string{}
		done := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			var req pushBody
			if err := json.Unmarshal(body, &req); err != nil {
				t.Errorf("body %q: %v", body, err)
			}
			key, data := req.Message.Attributes["key"], string(req.Message.Data)
			mu.Lock()
			if inFlight[key]++; inFlight[key] > 1 {
				t.Errorf("two messages of key %s at the endpoint at once", key)
			}
			if want := strconv.Itoa(len(acked[key])); data != want {
				t.Errorf("key %s: pushed message %s before %s was acked", key, data, want)
			}
			seen[data+key]++
			code := http.StatusInternalServerError
			if seen[data+key] > 1 {
				code = http.StatusOK
				acked[key] = append(acked[key], data)
				if len(acked[key]) == perKey && len(acked) == keys && allAcked(acked, perKey) {
					close(done)
				}
			}
			mu.Unlock()
			time.Sleep(time.Millisecond) // a request that takes a moment, so overlaps would show
			mu.Lock()
			inFlight[key]--
			mu.Unlock()
			w.WriteHeader(code)
		}))
		t.Cleanup(srv.Close)
		topic := createTopic(t, c)
		pushSub(t, tg, c, &pb.Subscription{Topic: topic, EnableMessageOrdering: true, PushConfig: &pb.PushConfig{PushEndpoint: srv.URL}})
		for i := range perKey {
			for k := range keys {
				key := "k" + strconv.Itoa(k)
				publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte(strconv.Itoa(i)), OrderingKey: key, Attributes: map[string]string{"key": key}})
			}
		}
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			mu.Lock()
			defer mu.Unlock()
			t.Fatalf("not all acked within 60s: %v", acked)
		}
	})
}

func allAcked(acked map[string][]string, n int) bool {
	for _, a := range acked {
		if len(a) != n {
			return false
		}
	}
	return true
}

// TestPushOrderedDeadlines: on an ordered subscription a message waiting
// for the earlier ones of its key is not timed out meanwhile; its ack
// deadline runs from its own request. Each push here takes 9 of the 10
// seconds, so a deadline counted from the first request would expire the
// third message and show as a second delivery attempt. Ours only: the
// test moves our clock.
func TestPushOrderedDeadlines(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	got := make(chan pushBody, 10)
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var req pushBody
		if err := json.Unmarshal(body, &req); err != nil {
			t.Errorf("body %q: %v", body, err)
		}
		got <- req
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(release) }) // before Close, which waits for the handler
	topic, dl := createTopic(t, c), createTopic(t, c)
	createSub(t, c, &pb.Subscription{Topic: topic, EnableMessageOrdering: true, AckDeadlineSeconds: 10,
		PushConfig:       &pb.PushConfig{PushEndpoint: srv.URL},
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dl, MaxDeliveryAttempts: 5}})
	publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("0"), OrderingKey: "k"},
		&pb.PubsubMessage{Data: []byte("1"), OrderingKey: "k"}, &pb.PubsubMessage{Data: []byte("2"), OrderingKey: "k"})
	for i := range 3 {
		var req pushBody
		select {
		case req = <-got:
		case <-time.After(10 * time.Second):
			t.Fatalf("push %d did not come", i)
		}
		if string(req.Message.Data) != strconv.Itoa(i) || req.DeliveryAttempt != 1 {
			t.Errorf("push %d: message %q, attempt %d; want message %d, attempt 1", i, req.Message.Data, req.DeliveryAttempt, i)
		}
		tg.sleep(9 * time.Second)
		release <- struct{}{}
	}
}

// TestPushOrderedDeadLetter: a message that keeps failing is dead-lettered
// after its attempts; the later message of its key, held back meanwhile,
// is then pushed, its attempts not used up by the waiting. Ours only: the
// emulator did not dead-letter an ordered push message within a minute.
func TestPushOrderedDeadLetter(t *testing.T) {
	forEachTargetWith(t, realClock, nil, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		e := newEndpoint(t, func(_ int, p pushed) int {
			var req pushBody
			if json.Unmarshal(p.body, &req) == nil && string(req.Message.Data) == "poison" {
				return http.StatusInternalServerError
			}
			return http.StatusOK
		})
		topic, dl := createTopic(t, c), createTopic(t, c)
		dlSub := pushSub(t, tg, c, &pb.Subscription{Topic: dl})
		pushSub(t, tg, c, &pb.Subscription{Topic: topic, EnableMessageOrdering: true, PushConfig: &pb.PushConfig{PushEndpoint: e.URL},
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dl, MaxDeliveryAttempts: 5}})
		publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("poison"), OrderingKey: "k"}, &pb.PubsubMessage{Data: []byte("fine"), OrderingKey: "k"})
		if m := pullOne(t, c, dlSub.Name, 60*time.Second); string(m.Message.Data) != "poison" {
			t.Errorf("dead-lettered %q, want the poison message", m.Message.Data)
		}
		for {
			req := decodeWrapped(t, e.next(t, 30*time.Second))
			if string(req.Message.Data) == "poison" {
				continue
			}
			if string(req.Message.Data) != "fine" || (tg.ours != nil && req.DeliveryAttempt != 1) {
				t.Errorf("after the dead letter: %q, attempt %d; want the next message, attempt 1", req.Message.Data, req.DeliveryAttempt)
			}
			return
		}
	})
}

// TestPushSeek: seeking a push subscription back pushes the acknowledged
// messages again. Two messages share an ordering key, so the second is
// pushed only once the first is acknowledged. Ours only: the emulator
// answers Seek on an ordered subscription with Unimplemented.
func TestPushSeek(t *testing.T) {
	forEachTargetWith(t, realClock, nil, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		e := newEndpoint(t, always(http.StatusOK))
		topic := createTopic(t, c)
		sub := pushSub(t, tg, c, &pb.Subscription{Topic: topic, RetainAckedMessages: true, EnableMessageOrdering: true,
			PushConfig: &pb.PushConfig{PushEndpoint: e.URL}})
		before := time.Now().Add(-time.Minute)
		ids := publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("1"), OrderingKey: "k"}, &pb.PubsubMessage{Data: []byte("2"), OrderingKey: "k"})
		for _, id := range ids {
			if got := decodeWrapped(t, e.next(t, 30*time.Second)).Message.MessageID; got != id {
				t.Fatalf("pushed %s, want %s", got, id)
			}
		}
		seekTo(t, c, sub.Name, before)
		if got := decodeWrapped(t, e.next(t, 30*time.Second)).Message.MessageID; got != ids[0] {
			t.Errorf("after the seek pushed %s, want the acknowledged %s again", got, ids[0])
		}
	})
}
