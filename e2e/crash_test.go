package e2e

// The crash-safety proof: the pipeline binary is killed with SIGKILL at
// random moments while it works, and restarted each time. With the disk
// store and the PostgreSQL sink, the table must end up holding exactly the
// published keys: none lost, none extra. With the Pub/Sub sink, every key
// must come out at least once, and copies beyond the first (the ones a kill
// between publish and commit can produce) must carry the key attribute so a
// reader can drop them. A kill can leave every message in flight between
// its publish and its commit to the dedup store; each of those comes out
// once more after the restart, so the extras are bounded by the in-flight
// limit (--max-outstanding) per kill — measured: a few hundred per kill at
// 1000 in flight — not by one per kill.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

const (
	crashKills     = 20
	crashCopyShare = 0.3 // share of keys published twice
	crashPace      = 20 * time.Second
	// crashMaxOutstanding is the pipeline's --max-outstanding: what a kill
	// can catch in flight.
	crashMaxOutstanding = 1000
)

// crashSize is the number of unique keys: 100,000, or
// DEDUPFLOW_CRASH_KEYS, or 20,000 with -short.
func crashSize(t *testing.T) int {
	if v := os.Getenv("DEDUPFLOW_CRASH_KEYS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("DEDUPFLOW_CRASH_KEYS=%q: want a positive number", v)
		}
		return n
	}
	if testing.Short() {
		return 20_000
	}
	return 100_000
}

func crashSeed(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("DEDUPFLOW_CRASH_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (set DEDUPFLOW_CRASH_SEED to repeat the kill and publish pattern)", seed)
	return seed
}

// publishInBackground publishes while the pipeline runs and is killed.
// publishing is spread over crashPace, about the length of the kill phase.
func publishInBackground(e *crashEnv, topic string, keys []string, seed uint64) func() *published {
	var pub *published
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub, err = e.publish(context.Background(), topic, keys, crashCopyShare, crashPace, rand.New(rand.NewPCG(seed, 1)))
	}()
	return func() *published {
		<-done
		if err != nil {
			e.t.Fatalf("publish: %v", err)
		}
		return pub
	}
}

// TestCrashSafetyPostgres kills the pipeline again and again on both of
// its receive paths: the default batch path and the official client's
// Receive (--receiver client), which must keep its guarantees too.
func TestCrashSafetyPostgres(t *testing.T) {
	t.Parallel()
	for _, receiver := range []string{"batch", "client"} {
		t.Run(receiver, func(t *testing.T) {
			t.Parallel()
			testCrashSafetyPostgres(t, receiver)
		})
	}
}

func testCrashSafetyPostgres(t *testing.T, receiver string) {
	pgURL := testenv.PostgresURL(t)
	st := newSinkTable(t, pgURL, "crash")
	keys, pub := crashIntoTable(t, crashKills, crashSize(t), "pg", []string{"--sink", pgURL, "--table", st.name, "--receiver", receiver}, st.count)
	st.check(t, keys, pub)
}

// crashPipeline is the pipeline the kill loops run: reading sub of e with
// dedup on the eid attribute, its state in a file that survives the kills,
// at most crashMaxOutstanding messages in flight, writing as sinkArgs say.
func crashPipeline(e *crashEnv, sub string, sinkArgs ...string) *pipelineProc {
	return &pipelineProc{e: e, args: append([]string{"pipeline",
		"--input-subscription", e.sub(sub), "--id-attribute", "eid", "--horizon", "1h",
		"--state", "file:" + filepath.Join(e.dir, "state.db"),
		"--max-outstanding", strconv.Itoa(crashMaxOutstanding), "--metrics-addr", "", "--log-level", "warn"}, sinkArgs...)}
}

func TestCrashSafetyPubSub(t *testing.T) {
	t.Parallel()
	n := crashSize(t)
	seed := crashSeed(t)
	e := newCrashEnv(t)
	e.createTopicSub("crash-in", "crash-in-sub")
	e.createTopicSub("crash-out", "crash-out-sub")

	// Read the output while the pipeline runs. Output message IDs tell
	// copies the pipeline published (new IDs) from redeliveries to this
	// reader (same ID), which are not the pipeline's doing.
	var (
		mu       sync.Mutex
		outIDs   = map[string]map[string]bool{} // key -> output message IDs
		noAttr   []string
		lastNew  time.Time
		received int
	)
	rctx, stopReading := context.WithCancel(context.Background())
	readDone := make(chan error, 1)
	go func() {
		sub := e.client.Subscriber(e.sub("crash-out-sub"))
		sub.ReceiveSettings.MaxOutstandingMessages = 5000
		readDone <- sub.Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			key := strings.TrimPrefix(string(m.Data), "payload-")
			mu.Lock()
			received++
			if m.Attributes["eid"] != key {
				noAttr = append(noAttr, m.ID)
			}
			if outIDs[key] == nil {
				outIDs[key] = map[string]bool{}
			}
			if !outIDs[key][m.ID] {
				outIDs[key][m.ID] = true
				lastNew = time.Now()
			}
			mu.Unlock()
			m.Ack()
		})
	}()

	keys := crashKeys(n, "ps")
	p := crashPipeline(e, "crash-in-sub", "--sink", "pubsub", "--output-topic", e.topic("crash-out"))
	start := time.Now()
	wait := publishInBackground(e, "crash-in", keys, seed)
	seeks := crashLoop(t, e, p, crashKills, "crash-in-sub", start.Add(-time.Second), rand.New(rand.NewPCG(seed, 2)), func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(outIDs)
	})
	lastKill := time.Now()
	pub := wait()
	t.Logf("%v; %d kills, %d seeks back to the start, in %v", pub, crashKills, seeks, time.Since(start).Round(time.Millisecond))

	// Done when every key came out, the claim lease of the last killed run
	// (30 s) has passed — a copy waiting on it may still produce an extra —
	// and nothing new came for 5 s.
	await(t, 6*time.Minute, func() (bool, string) {
		mu.Lock()
		seen, quiet := len(outIDs), time.Since(lastNew)
		mu.Unlock()
		return seen >= n && time.Since(lastKill) > 40*time.Second && quiet > 5*time.Second,
			fmt.Sprintf("%d of %d keys came out", seen, n)
	}, p)
	p.stop()
	stopReading()
	if err := <-readDone; err != nil {
		t.Errorf("reading the output: %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	var missing, unexpected []string
	outputs, extraKeys := 0, 0
	for _, k := range keys {
		c := len(outIDs[k])
		if c == 0 {
			missing = append(missing, k)
		}
		if c > 1 {
			extraKeys++
		}
		outputs += c
	}
	for k := range outIDs {
		if _, ok := pub.ids[k]; !ok {
			unexpected = append(unexpected, k)
		}
	}
	extras := outputs - (n - len(missing))
	t.Logf("output: %d distinct messages (%d deliveries to the reader) for %d keys; %d extra copies on %d keys after %d kills; %d without the id attribute",
		outputs, received, len(outIDs), extras, extraKeys, crashKills, len(noAttr))
	if len(missing) > 0 {
		t.Errorf("%d keys never came out, e.g. %v", len(missing), missing[:min(5, len(missing))])
	}
	if len(unexpected) > 0 {
		t.Errorf("%d keys came out that were never published, e.g. %v", len(unexpected), unexpected[:min(5, len(unexpected))])
	}
	if len(noAttr) > 0 {
		t.Errorf("%d outputs lack the eid attribute that lets a reader drop copies", len(noAttr))
	}
	// A kill can catch every message in flight between "published" and
	// "committed to the store", and each of those comes out again after the
	// restart: the bound is the in-flight limit per kill, not one per kill.
	if extras > crashKills*crashMaxOutstanding {
		t.Errorf("%d extra copies after %d kills: more than %d (the in-flight limit) per kill", extras, crashKills, crashMaxOutstanding)
	}
}
