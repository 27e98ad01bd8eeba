package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// startPushPipeline runs `dedupflow pipeline --input-push ADDR` in the
// test until it ends and returns the endpoint it names and its log.
func startPushPipeline(t *testing.T, addr string, args ...string) (string, *testenv.Buffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testenv.Buffer
	done, exited := make(chan error, 1), make(chan struct{})
	args = append([]string{"pipeline", "--project", "test", "--metrics-addr", "", "--output-topic", "output",
		"--input-push", addr, "--push-path", "/push"}, args...)
	go func() { done <- run(ctx, args, &stdout, &stderr); close(exited) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v\n%s", err, &stderr)
		}
	})
	ep := waitFor(t, "start line", &stderr, &stdout, regexp.MustCompile(`msg="pipeline running" push_endpoint=(\S+)`), exited)
	return ep, &stderr
}

// post sends a hand-made push request and returns the status.
func post(t *testing.T, endpoint, token string, header ...string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, endpoint, strings.NewReader(`{"message":{"data":"Zm9yZ2Vk","messageId":"forged-1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestInputPushAuth: with --push-audience and --push-service-account the
// push endpoint takes what the broker's push subscription sends with its
// OIDC token, and refuses a hand-made body without a token, or with a
// token for another audience or service account. A browser's cross-site
// request is refused with or without verification, and an endpoint that
// verifies nothing warns when it listens beyond loopback.
func TestInputPushAuth(t *testing.T) {
	_, addr, c := serveTestBroker(t, "test")
	ctx := context.Background()
	for _, topic := range []string{"events", "output", "tokens"} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/test/topics/" + topic}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: "projects/test/subscriptions/out-sub", Topic: "projects/test/topics/output"}); err != nil {
		t.Fatal(err)
	}
	const aud, sa = "https://dedup.example/push", "pusher@test.iam.gserviceaccount.com"
	oidc := func(aud, sa string) *pb.PushConfig_OidcToken_ {
		return &pb.PushConfig_OidcToken_{OidcToken: &pb.PushConfig_OidcToken{Audience: aud, ServiceAccountEmail: sa}}
	}

	endpoint, _ := startPushPipeline(t, "127.0.0.1:0", "--push-audience", aud, "--push-service-account", sa,
		"--push-jwks", "http://"+addr+broker.PushKeysPath)
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: "projects/test/subscriptions/push", Topic: "projects/test/topics/events",
		PushConfig: &pb.PushConfig{PushEndpoint: endpoint, AuthenticationMethod: oidc(aud, sa)},
	}); err != nil {
		t.Fatal(err)
	}
	p := c.Publisher("events")
	if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("pushed")}).Get(ctx); err != nil {
		t.Fatal(err)
	}
	p.Stop()
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	var got string
	_ = c.Subscriber("out-sub").Receive(rctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		got = string(m.Data)
		cancel()
	})
	cancel()
	if got != "pushed" {
		t.Fatalf("output %q: the verified push did not come through", got)
	}

	// Tokens the broker signs for other push configs, caught by an
	// endpoint of the test's own.
	tokens := make(chan string, 10)
	catcher := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens <- strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	}))
	defer catcher.Close()
	caught := 0
	token := func(aud, sa string) string {
		caught++
		name := fmt.Sprintf("projects/test/subscriptions/catch-%d", caught)
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: name, Topic: "projects/test/topics/tokens",
			PushConfig: &pb.PushConfig{PushEndpoint: catcher.URL, AuthenticationMethod: oidc(aud, sa)}}); err != nil {
			t.Fatal(err)
		}
		p := c.Publisher("tokens")
		defer p.Stop()
		if _, err := p.Publish(ctx, &pubsub.Message{Data: []byte("x")}).Get(ctx); err != nil {
			t.Fatal(err)
		}
		tok := <-tokens
		if err := c.SubscriptionAdminClient.DeleteSubscription(ctx, &pb.DeleteSubscriptionRequest{Subscription: name}); err != nil {
			t.Fatal(err)
		}
		return tok
	}
	good := token(aud, sa)
	for _, tc := range []struct {
		name, token string
		header      []string
		want        int
	}{
		{"no token", "", nil, http.StatusUnauthorized},
		{"another audience", token("https://other.example/push", sa), nil, http.StatusUnauthorized},
		{"another service account", token(aud, "intruder@test.iam.gserviceaccount.com"), nil, http.StatusUnauthorized},
		{"not signed by the keys", good[:strings.LastIndexByte(good, '.')] + ".AAAA", nil, http.StatusUnauthorized},
		{"cross-site page, good token", good, []string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, http.StatusForbidden},
		{"good token", good, nil, http.StatusNoContent},
	} {
		if got := post(t, endpoint, tc.token, tc.header...); got != tc.want {
			t.Errorf("%s: answered %d, want %d", tc.name, got, tc.want)
		}
	}

	// Without verification, a browser is still refused, and the start
	// says that anyone who reaches the endpoint can post.
	open, log := startPushPipeline(t, "0.0.0.0:0")
	if !strings.Contains(log.String(), "listening beyond loopback, without authentication") {
		t.Errorf("no warning for an endpoint beyond loopback without verification:\n%s", log)
	}
	open = strings.Replace(open, "0.0.0.0", "127.0.0.1", 1)
	for _, h := range [][]string{
		{"Origin", "http://evil.example"},
		{"Sec-Fetch-Site", "cross-site"},
		{"Sec-Fetch-Site", "same-site", "Origin", "http://other.localhost:8000"},
	} {
		if got := post(t, open, "", h...); got != http.StatusForbidden {
			t.Errorf("browser request %v: answered %d, want 403", h, got)
		}
	}
}
