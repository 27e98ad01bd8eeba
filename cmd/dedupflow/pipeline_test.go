package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
	"github.com/dedupflow/dedupflow/store/disk"
)

// TestPipelineFlagsBeforeConnecting: a bad or misplaced flag is refused
// with its own message before the client connects. Without credentials
// (and no emulator) connecting fails, so a check made only after it would
// show the user a credentials error instead.
func TestPipelineFlagsBeforeConnecting(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	base := []string{"pipeline", "--project", "proj", "--input-subscription", "sub", "--metrics-addr", ""}
	for _, tc := range []struct {
		args []string
		want string
	}{
		// Flags of one sink given with another.
		{[]string{"--output-topic", "out", "--on-conflict", "update"}, "--on-conflict applies to --sink postgres only, not --sink pubsub"},
		{[]string{"--sink", "stdout", "--on-conflict", "nothing"}, "--on-conflict applies to --sink postgres only"},
		{[]string{"--sink", "stdout", "--table", "orders"}, "--table applies to --sink postgres only, not --sink stdout"},
		{[]string{"--output-topic", "out", "--table", "orders"}, "--table applies to --sink postgres only, not --sink pubsub"},
		{[]string{"--sink", "stdout", "--output-topic", "out"}, "--output-topic applies to --sink pubsub only, not --sink stdout"},
		{[]string{"--sink", "postgres://u:secret@db/x", "--output-topic", "out"}, "not --sink postgres://u:xxxxx@db/x"},
		{[]string{"--sink", "postgres://u@db/x", "--on-conflict", "replace"}, "want nothing or update"},
		{[]string{"--sink", "kafka"}, `unknown --sink "kafka"`},
		{[]string{"--sink", "stdout", "--metadata-columns", "none"}, "--metadata-columns applies to table sinks only, not --sink stdout"},
		{[]string{"--output-topic", "out", "--fields", "a"}, "--fields applies to table sinks only, not --sink pubsub"},
		{[]string{"--sink", "bigquery://p/d", "--on-conflict", "update"}, "--on-conflict applies to --sink postgres only, not --sink bigquery (it appends each key once, the first write kept)"},
		{[]string{"--sink", "bigquery://p/d", "--metadata-columns", "key,bogus"}, `--metadata-columns: unknown metadata column "bogus"`},
		{[]string{"--sink", "bigquery://dedupflow/ncshop", "--table", "dedupflow.ncshop.orders"}, "--table dedupflow.ncshop.orders: --table takes a table ID, not PROJECT.DATASET.TABLE (the project and dataset are --sink's): give --sink bigquery://dedupflow/ncshop --table orders"},
		{[]string{"--sink", "bigquery://p/d", "--table", "other.orders"}, "give --sink bigquery://p/other --table orders"},
		{[]string{"--sink", "spanner://projects/p/databases/d"}, "want spanner://projects/P/instances/I/databases/D"},
		{[]string{"--sink", "spanner://projects/p/instances/i/databases/d", "--on-conflict", "update"}, "--on-conflict applies to --sink postgres only, not --sink spanner"},
		{[]string{"--sink", "spanner://projects/p/instances/i/databases/d", "--metadata-columns", "key,bogus"}, `--metadata-columns: unknown metadata column "bogus"`},
		{[]string{"--sink", "spanner://projects/p/instances/i/databases/d", "--metadata-columns", "key=id", "--fields", "id,n"}, `--fields: "id" is also a metadata column`},
		{[]string{"--sink", "bigtable://projects/p"}, "want bigtable://projects/P/instances/I"},
		{[]string{"--sink", "bigtable://projects/p/instances/i", "--row-key", "{user}"}, "--row-key: row key template \"{user}\": unknown {user}"},
		{[]string{"--sink", "spanner://projects/p/instances/i/databases/d", "--column-family", "f"}, "--column-family applies to --sink bigtable only, not --sink spanner"},
		{[]string{"--sink", "stdout", "--row-key", "{key}"}, "--row-key applies to --sink bigtable only, not --sink stdout"},
		// How messages are pulled.
		{[]string{"--sink", "stdout", "--receiver", "fast"}, `unknown --receiver "fast": want client or batch`},
		{[]string{"--sink", "stdout", "--streams", "0"}, "--streams 0 must be at least 1"},
		{[]string{"--sink", "stdout", "--receiver", "batch", "--batch-wait", "2s"}, "--batch-wait 2s: want 0 (hand over at once what has arrived) to 1s"},
		{nil, "missing output: give --output-topic"},
		// Attribute names Pub/Sub refuses.
		{[]string{"--sink", "stdout", "--id-attribute", "goog_key"}, `--id-attribute: invalid attribute key: "goog_key" starts with "goog", which is reserved by Pub/Sub`},
		{[]string{"--sink", "stdout", "--timestamp-attribute", "GOOGts"}, "--timestamp-attribute: invalid attribute key"},
		{[]string{"--sink", "stdout", "--output-id-attribute", strings.Repeat("k", 257)}, "is 257 bytes, the limit is 256"},
		{[]string{"--sink", "stdout", "--id-attribute", "key", "--producer-attribute", "a\xff"}, "--producer-attribute: invalid attribute key: \"a\\xff\" is not valid UTF-8"},
		// The audit's sizes: zero is not the default.
		{[]string{"--sink", "stdout", "--audit-horizon", "7d", "--audit-fp", "0"}, "--audit-fp 0 is out of range: want a rate between 0 and 0.5"},
		{[]string{"--sink", "stdout", "--audit-horizon", "7d", "--audit-fp", "0.5"}, "--audit-fp 0.5 is out of range"},
		{[]string{"--sink", "stdout", "--audit-horizon", "7d", "--audit-fp", "-0.1"}, "between 0 and 0.5"},
		{[]string{"--sink", "stdout", "--audit-horizon", "7d", "--audit-capacity", "0"}, "--audit-capacity 0 is out of range: want at least 8"},
		// The store and its horizon.
		{[]string{"--sink", "stdout", "--state", "bogus"}, `--state: unknown state "bogus": want mem, file:PATH or redis://`},
		{[]string{"--sink", "stdout", "--state", "file:"}, "empty path"},
		{[]string{"--sink", "stdout", "--horizon", "2200h"}, "--horizon 2200h0m0s is longer than the memory store holds"},
		{[]string{"--sink", "stdout", "--state", "file:" + filepath.Join(t.TempDir(), "s"), "--horizon", "9000h"}, "longer than the disk store holds"},
		{[]string{"--sink", "stdout", "--state", "redis://127.0.0.1:1/0", "--horizon", "9000h"}, "longer than the Redis store holds"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var stdout, stderr testenv.Buffer
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			err := run(ctx, append(append([]string{}, base...), tc.args...), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
	// The premise: flags that pass get as far as connecting, and fail there.
	var stdout, stderr testenv.Buffer
	err := run(context.Background(), append(base, "--sink", "stdout"), &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "connect to pubsub") {
		t.Fatalf("good flags without credentials: %v, want a connection error", err)
	}
}

// TestFlagFromEnvNamed: a flag set from its DEDUPFLOW_* variable is named
// as that variable in an error about it, whichever check finds it, as a
// value the flag does not take is; given on the command line it stays
// the flag.
func TestFlagFromEnvNamed(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "none.json"))
	pipe := []string{"pipeline", "--project", "proj", "--input-subscription", "sub", "--metrics-addr", ""}
	for _, tc := range []struct {
		env  string
		args []string
		want string
	}{
		{"DEDUPFLOW_ON_CONFLICT=upsert", append(pipe, "--sink", "postgres://u@db/x"),
			`unknown on-conflict action "upsert": want nothing or update (--on-conflict is $DEDUPFLOW_ON_CONFLICT)`},
		{"DEDUPFLOW_RECEIVER=fast", append(pipe, "--sink", "stdout"), `(--receiver is $DEDUPFLOW_RECEIVER)`},
		{"DEDUPFLOW_SINK=stdout", append(pipe, "--on-conflict", "update"), "--on-conflict applies to --sink postgres only, not --sink stdout (--sink is $DEDUPFLOW_SINK)"},
		{"DEDUPFLOW_HORIZON=5minutes", append(pipe, "--sink", "stdout"), `DEDUPFLOW_HORIZON="5minutes"`},
		{"DEDUPFLOW_COPIES=0", []string{"publish", "--project", "proj", "--topic", "t", "--data", "x"}, "(--copies is $DEDUPFLOW_COPIES)"},
		{"DEDUPFLOW_HORIZON=1s", []string{"up", "--audit-horizon", "1s"}, "(--horizon is $DEDUPFLOW_HORIZON)"},
	} {
		t.Run(tc.env, func(t *testing.T) {
			name, value, _ := strings.Cut(tc.env, "=")
			t.Setenv(name, value)
			err := run(t.Context(), tc.args, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// startBroker starts the embedded broker, points the client library (of
// this process and of the commands it starts) at it, and returns its
// address and a client for project.
func startBroker(t *testing.T, project string) (string, *pubsub.Client) {
	t.Helper()
	_, addr, c := serveTestBroker(t, project)
	return addr, c
}

// serveTestBroker is startBroker, also returning the broker, for a test
// that closes it under a command.
func serveTestBroker(t *testing.T, project string) (*broker.Broker, string, *pubsub.Client) {
	t.Helper()
	b, addr := brokertest.StartWith(t, broker.Options{})
	t.Setenv("PUBSUB_EMULATOR_HOST", addr)
	return b, addr, brokertest.Dial(t, addr, project)
}

// startInput starts a broker of project "test" with topic "input" and its
// subscription "input-sub".
func startInput(t *testing.T) (*broker.Broker, *pubsub.Client) {
	t.Helper()
	b, _, c := serveTestBroker(t, "test")
	ctx := context.Background()
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/test/topics/input"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: "projects/test/subscriptions/input-sub", Topic: "projects/test/topics/input",
	}); err != nil {
		t.Fatal(err)
	}
	return b, c
}

// freeAddr returns a loopback address that was free a moment ago, for a
// command's listener.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestPipelineStart: an input that does not exist is refused before the
// pipeline says it runs, the start line names the output each sink writes
// to, and a pipeline without an id attribute says what it then drops.
func TestPipelineStart(t *testing.T) {
	startInput(t)
	ctx := context.Background()
	base := []string{"pipeline", "--project", "test", "--metrics-addr", "", "--sink", "stdout"}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--input-subscription", "nosuch"}, "subscription projects/test/subscriptions/nosuch does not exist"},
		{[]string{"--input-topic", "nosuch"}, "topic projects/test/topics/nosuch does not exist"},
	} {
		var stdout, stderr testenv.Buffer
		ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := run(ctx, append(append([]string{}, base...), tc.args...), &stdout, &stderr)
		cancel()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one saying %q", tc.args, err, tc.want)
		}
		if strings.Contains(stderr.String(), "pipeline running") {
			t.Errorf("%v: logged \"pipeline running\" before failing:\n%s", tc.args, &stderr)
		}
	}

	var stdout, stderr testenv.Buffer
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(rctx, append(base, "--input-subscription", "input-sub"), &stdout, &stderr) }()
	exited := make(chan struct{})
	line := waitFor(t, "start line", &stderr, &stdout, regexp.MustCompile(`(?m)^(.*msg="pipeline running".*)$`), exited)
	cancel()
	if err := <-done; err != nil {
		t.Errorf("pipeline after cancel: %v\n%s", err, &stderr)
	}
	if !strings.Contains(line, " output=stdout ") || strings.Contains(line, "projects///") {
		t.Errorf("start line %q: want output=stdout", line)
	}
	if !strings.Contains(stderr.String(), `no --id-attribute: redeliveries are dropped by message ID, republished copies pass; publish and loadgen stamp their key in \"key\"`) {
		t.Errorf("no --id-attribute, and no line saying what that drops:\n%s", &stderr)
	}
}

// TestPipelineBatchReceiver: with --receiver batch the pipeline pulls a
// response at a time and emits each key once.
func TestPipelineBatchReceiver(t *testing.T) {
	_, c := startInput(t)
	ctx := context.Background()
	pub := c.Publisher("projects/test/topics/input")
	defer pub.Stop()
	var results []*pubsub.PublishResult
	for i := range 20 {
		results = append(results, pub.Publish(ctx, &pubsub.Message{Data: []byte("m"), Attributes: map[string]string{"key": fmt.Sprint("k", i%15)}}))
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	var stdout, stderr testenv.Buffer
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(rctx, []string{"pipeline", "--project", "test", "--metrics-addr", "", "--sink", "stdout", "--id-attribute", "key",
			"--input-subscription", "input-sub", "--receiver", "batch", "--streams", "1"}, &stdout, &stderr)
	}()
	for deadline := time.Now().Add(20 * time.Second); strings.Count(stdout.String(), "\n") < 15; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("15 keys not emitted in 20 s:\n%s\n%s", &stdout, &stderr)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("pipeline after cancel: %v\n%s", err, &stderr)
	}
	keys := map[string]bool{}
	for _, line := range strings.Split(strings.TrimSpace(stdout.String()), "\n") {
		var l struct{ Key string }
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatal(err)
		}
		if keys[l.Key] {
			t.Errorf("key %s emitted twice", l.Key)
		}
		keys[l.Key] = true
	}
	if len(keys) != 15 {
		t.Errorf("%d keys emitted, want 15:\n%s", len(keys), &stdout)
	}
	if strings.Contains(stderr.String(), "no --id-attribute") {
		t.Errorf("given --id-attribute, and still told there is none:\n%s", &stderr)
	}
}

// The start line's output for each sink.
func TestOutputLabel(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--sink", "pubsub", "--output-topic", "out"}, "projects/p/topics/out"},
		{[]string{"--output-topic", "projects/p/topics/out"}, "projects/p/topics/out"},
		{[]string{"--sink", "stdout"}, "stdout"},
		{[]string{"--sink", "postgres://u:pw@db/x", "--table", "orders"}, "table orders"},
		{[]string{"--sink", "postgresql://db/x", "--table", ""}, "table events"},
	} {
		var j jobFlags
		fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
		j.register(fs)
		if err := fs.Parse(append([]string{"--project", "p", "--input-subscription", "sub"}, tc.args...)); err != nil {
			t.Fatal(err)
		}
		j.given = given(fs)
		cfg, err := j.config()
		if err != nil {
			t.Fatalf("%q: %v", tc.args, err)
		}
		if got := cfg.outputLabel(); got != tc.want {
			t.Errorf("%q: output %q, want %q", tc.args, got, tc.want)
		}
	}
}

// TestPipelineFailedStartLeavesNoStore: a start that fails after the disk
// store opened (the metrics port is taken) removes the store folder it
// created, and keeps one that was there before.
func TestPipelineFailedStartLeavesNoStore(t *testing.T) {
	startInput(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "horizon")
	start := func() error {
		var stdout, stderr testenv.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		return run(ctx, []string{"pipeline", "--project", "test", "--input-subscription", "input-sub", "--sink", "stdout",
			"--state", "file:" + dir, "--metrics-addr", ln.Addr().String()}, &stdout, &stderr)
	}
	if err := start(); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("pipeline with its metrics port taken: %v, want address already in use", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("after the failed start, the store folder: %v, want it gone", err)
	}
	// A folder that was there before is the user's: it stays.
	s, err := disk.Open(context.Background(), dir, disk.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := start(); err == nil {
		t.Fatal("second start: no error")
	}
	if _, err := os.Stat(filepath.Join(dir, "LOCK")); err != nil {
		t.Fatalf("a store folder that existed before the failed start: %v, want it kept", err)
	}
}
