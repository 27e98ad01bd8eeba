package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
)

// TestBrokerSharedFlags: broker reads its flags from DEDUPFLOW_* variables
// and takes --log-format and --log-level, as every other command does.
func TestBrokerSharedFlags(t *testing.T) {
	t.Setenv("DEDUPFLOW_LISTEN", "127.0.0.1:0")
	t.Setenv("DEDUPFLOW_LOG_LEVEL", "debug")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	errR, errW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runBroker(ctx, []string{"--log-format=json"}, outW, errW)
		outW.Close()
		errW.Close()
		done <- err
	}()
	logs := make(chan string, 100)
	go func() {
		defer close(logs)
		sc := bufio.NewScanner(errR)
		for sc.Scan() {
			logs <- sc.Text()
		}
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("read stdout: %v", err)
	}
	if !strings.HasPrefix(line, "export PUBSUB_EMULATOR_HOST=127.0.0.1:") || strings.HasSuffix(line, ":8085\n") {
		t.Fatalf("stdout %q: want the port DEDUPFLOW_LISTEN picked", line)
	}
	go io.Copy(io.Discard, outR)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("broker: %v", err)
	}
	var listening bool
	for l := range logs {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("log line %q is not JSON (--log-format json): %v", l, err)
		}
		if rec["msg"] == "broker listening" {
			listening = true
		}
	}
	if !listening {
		t.Fatal("no \"broker listening\" record in the JSON log")
	}
}

// serveBroker runs `dedupflow broker args...` until the test ends and
// returns the address it serves on.
func serveBroker(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := runBroker(ctx, args, outW, io.Discard)
		outW.CloseWithError(err)
		done <- err
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("broker: %v", err)
		}
	})
	line, err := bufio.NewReader(outR).ReadString('\n')
	if err != nil {
		t.Fatalf("broker did not start: %v", err)
	}
	go io.Copy(io.Discard, outR)
	return strings.TrimPrefix(strings.TrimSpace(line), "export PUBSUB_EMULATOR_HOST=")
}

// TestBrokerBootstrap: topics and subscriptions from --topic,
// --subscription and a bootstrap file named by DEDUPFLOW_BOOTSTRAP exist
// when the broker starts serving; the file read again on a restart with the
// same data dir is fine, and a changed one is refused naming the field.
func TestBrokerBootstrap(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "pubsub.yaml")
	yaml := "subscriptions:\n  - name: eu-orders\n    topic: orders\n    filter: 'attributes.region = \"eu\"'\n    ackDeadlineSeconds: 30\ntopics:\n  - name: orders\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("DEDUPFLOW_LISTEN", "127.0.0.1:0")
	t.Setenv("DEDUPFLOW_PROJECT", "shop")
	t.Setenv("DEDUPFLOW_BOOTSTRAP", file)
	t.Setenv("DEDUPFLOW_SUBSCRIPTION", "audit:audit-all,audit:audit-2")
	data := filepath.Join(dir, "data")
	for round := range 2 {
		t.Run(fmt.Sprint("start ", round+1), func(t *testing.T) {
			addr := serveBroker(t, "--data-dir", data, "--topic", "extra")
			t.Setenv("PUBSUB_EMULATOR_HOST", addr)
			c, err := pubsub.NewClient(context.Background(), "shop")
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx := context.Background()
			s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: "projects/shop/subscriptions/eu-orders"})
			if err != nil || s.Filter != `attributes.region = "eu"` || s.AckDeadlineSeconds != 30 || s.Topic != "projects/shop/topics/orders" {
				t.Fatalf("subscription from the file: %v %v", s, err)
			}
			for _, sub := range []string{"audit-all", "audit-2"} {
				if _, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: "projects/shop/subscriptions/" + sub}); err != nil {
					t.Errorf("subscription %s from DEDUPFLOW_SUBSCRIPTION: %v", sub, err)
				}
			}
			if _, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/shop/topics/extra"}); err != nil {
				t.Errorf("topic from --topic: %v", err)
			}
		})
	}
	if err := os.WriteFile(file, []byte(strings.Replace(yaml, "30", "60", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	err := runBroker(context.Background(), []string{"--data-dir", data}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ackDeadlineSeconds is 30, the bootstrap asks for 60") {
		t.Errorf("a changed bootstrap file: got %v, want the conflicting field named", err)
	}
	t.Setenv("DEDUPFLOW_PROJECT", "")
	err = runBroker(context.Background(), nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "short ID and no project") {
		t.Errorf("short IDs without a project: got %v", err)
	}
}

// TestBrokerSubscriptionFlag: a --subscription without its topic is an
// error that names where it came from, the flag or the variable.
func TestBrokerSubscriptionFlag(t *testing.T) {
	err := runBroker(context.Background(), []string{"--subscription", "orders"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `"orders": want TOPIC:SUBSCRIPTION`) {
		t.Errorf("--subscription orders: got %v", err)
	}
	t.Setenv("DEDUPFLOW_SUBSCRIPTION", "orders-sub")
	err = runBroker(context.Background(), nil, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `DEDUPFLOW_SUBSCRIPTION="orders-sub"`) {
		t.Errorf("DEDUPFLOW_SUBSCRIPTION=orders-sub: got %v", err)
	}
}

// TestBrokerBeyondLoopback: a broker on every interface warns that its API
// lets anyone publish and delete topics, and prints an address a client can
// dial, not the wildcard it listens on.
func TestBrokerBeyondLoopback(t *testing.T) {
	for _, listen := range []string{"0.0.0.0:0", "[::]:0"} {
		t.Run(listen, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			outR, outW := io.Pipe()
			var stderr strings.Builder
			done := make(chan error, 1)
			go func() {
				err := runBroker(ctx, []string{"--listen", listen}, outW, &stderr)
				outW.Close()
				done <- err
			}()
			line, err := bufio.NewReader(outR).ReadString('\n')
			if err != nil {
				t.Fatalf("read stdout: %v", err)
			}
			go io.Copy(io.Discard, outR)
			cancel()
			if err := <-done; err != nil {
				t.Fatalf("broker: %v", err)
			}
			if !strings.HasPrefix(line, "export PUBSUB_EMULATOR_HOST=127.0.0.1:") {
				t.Errorf("stdout %q: want a dialable 127.0.0.1:PORT", line)
			}
			if !strings.Contains(stderr.String(), "create or delete topics") {
				t.Errorf("stderr lacks the warning that anyone can change topics:\n%s", stderr.String())
			}
		})
	}
}
