package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/internal/testenv/brokertest"
)

// crashEnv is one crash-test run: an in-process broker (it is not the one
// being killed), a client for it, and the dedupflow binary.
type crashEnv struct {
	t       *testing.T
	dir     string
	bin     string
	addr    string // broker host:port
	client  *pubsub.Client
	project string
}

const crashProject = "crash-proof"

// newCrashEnv builds the binary (without -race: the binary is what is
// killed, not what is checked) and starts a broker, whose address each
// command gets in its own environment, leaving the process's alone so that
// the tests run in parallel.
func newCrashEnv(t *testing.T) *crashEnv {
	t.Helper()
	dir := t.TempDir()
	bin := buildBinary(t, false)
	addr := brokertest.Start(t)
	c := brokertest.Dial(t, addr, crashProject)
	return &crashEnv{t: t, dir: dir, bin: bin, addr: addr, client: c, project: crashProject}
}

func (e *crashEnv) topic(id string) string {
	return fmt.Sprintf("projects/%s/topics/%s", e.project, id)
}

func (e *crashEnv) sub(id string) string {
	return fmt.Sprintf("projects/%s/subscriptions/%s", e.project, id)
}

// createTopic creates the topic id.
func (e *crashEnv) createTopic(id string) {
	e.t.Helper()
	if _, err := e.client.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: e.topic(id)}); err != nil {
		e.t.Fatal(err)
	}
}

// createTopicSub creates topic and a subscription of it that retains
// acknowledged messages, so seekTo redelivers what was already acked too,
// not only the backlog the pipeline happens to hold at that moment (a fast
// pipeline holds almost none).
func (e *crashEnv) createTopicSub(topic, sub string) {
	e.t.Helper()
	e.createTopic(topic)
	if _, err := e.client.SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{
		Name: e.sub(sub), Topic: e.topic(topic), AckDeadlineSeconds: 10, RetainAckedMessages: true,
	}); err != nil {
		e.t.Fatal(err)
	}
}

// seekTo makes the subscription deliver again everything published since
// t, acknowledged or not: forced redeliveries of the same message IDs.
// (Seeking to a time also acknowledges everything published before it, so
// t must precede the first publish, or the backlog would be dropped.)
func (e *crashEnv) seekTo(sub string, t time.Time) error {
	_, err := e.client.SubscriptionAdminClient.Seek(context.Background(), &pb.SeekRequest{
		Subscription: e.sub(sub), Target: &pb.SeekRequest_Time{Time: timestamppb.New(t)},
	})
	return err
}

// published is what the publisher sent: key -> message IDs of its copies.
type published struct {
	mu    sync.Mutex
	ids   map[string][]string
	total int
	took  time.Duration
}

// String says how much was published, for a test's log.
func (p *published) String() string {
	return fmt.Sprintf("published %d messages for %d keys (%d republished copies) in %v",
		p.total, len(p.ids), p.total-len(p.ids), p.took.Round(time.Millisecond))
}

// publishInBackground publishes keys to "input" (with copyShare copies)
// while the test goes on; the returned func waits for it and fails the
// test if publishing failed.
func (e *crashEnv) publishInBackground(t *testing.T, keys []string, pace time.Duration, seed uint64) func() *published {
	var pub *published
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub, err = e.publish(context.Background(), "input", keys, crashCopyShare, pace, rand.New(rand.NewPCG(seed, 1)))
	}()
	return func() *published {
		t.Helper()
		<-done
		if err != nil {
			t.Fatalf("publish: %v", err)
		}
		return pub
	}
}

// publish sends every key once and a share of them twice (republished
// copies with new message IDs), in random order, with the key in the "eid"
// attribute and "payload-KEY" as data. Publishing is spread evenly over
// pace, so the pipeline has fresh work during the whole kill phase.
func (e *crashEnv) publish(ctx context.Context, topic string, keys []string, copyShare float64, pace time.Duration, rng *rand.Rand) (*published, error) {
	order := make([]string, 0, len(keys)+int(float64(len(keys))*copyShare)+1)
	order = append(order, keys...)
	for _, k := range keys {
		if rng.Float64() < copyShare {
			order = append(order, k)
		}
	}
	rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	p := e.client.Publisher(e.topic(topic))
	defer p.Stop()
	res := make([]*pubsub.PublishResult, len(order))
	const steps = 100
	start := time.Now()
	for i, k := range order {
		if i%(len(order)/steps+1) == 0 {
			time.Sleep(time.Until(start.Add(pace * time.Duration(i) / time.Duration(len(order)))))
		}
		res[i] = p.Publish(ctx, &pubsub.Message{Data: []byte("payload-" + k), Attributes: map[string]string{"eid": k}})
	}
	out := &published{ids: make(map[string][]string, len(keys)), total: len(order)}
	for i, r := range res {
		id, err := r.Get(ctx)
		if err != nil {
			return nil, fmt.Errorf("publish %s: %w", order[i], err)
		}
		out.mu.Lock()
		out.ids[order[i]] = append(out.ids[order[i]], id)
		out.mu.Unlock()
	}
	out.took = time.Since(start)
	return out, nil
}

// pipelineProc runs the dedupflow binary again and again.
type pipelineProc struct {
	e    *crashEnv
	args []string
	runs int
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed once the current run has exited and been reaped
	err  error         // the current run's exit, once done is closed
}

func (p *pipelineProc) start() {
	p.e.t.Helper()
	p.runs++
	f, err := os.Create(filepath.Join(p.e.dir, fmt.Sprintf("run-%02d.log", p.runs)))
	if err != nil {
		p.e.t.Fatal(err)
	}
	cmd := exec.Command(p.e.bin, p.args...)
	cmd.Env = append(os.Environ(), "PUBSUB_EMULATOR_HOST="+p.e.addr)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		p.e.t.Fatal(err)
	}
	p.cmd, p.log = cmd, f
	// One goroutine reaps each run: a process that died but was not
	// waited for would still answer signal 0, and look alive.
	done := make(chan struct{})
	p.done = done
	go func() {
		p.err = cmd.Wait()
		close(done)
	}()
}

// kill ends the running process with SIGKILL: no deferred code, no flush.
func (p *pipelineProc) kill() {
	p.e.t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		p.e.t.Fatalf("kill run %d: %v (it died on its own?)\n%s", p.runs, err, p.tail())
	}
	<-p.done
	_ = p.log.Close()
}

// end kills the current run if it still runs, for a test's cleanup.
func (p *pipelineProc) end() {
	if !p.exited() {
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// exited reports whether the current run ended by itself (a crash of
// dedupflow, not of ours).
func (p *pipelineProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the last run gracefully.
func (p *pipelineProc) stop() {
	p.e.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			p.e.t.Errorf("last run exited with %v\n%s", p.err, p.tail())
		}
	case <-time.After(60 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		p.e.t.Errorf("last run did not stop within 60s of SIGTERM\n%s", p.tail())
	}
	_ = p.log.Close()
}

// tail is the end of the current run's log.
func (p *pipelineProc) tail() string {
	b, _ := os.ReadFile(filepath.Join(p.e.dir, fmt.Sprintf("run-%02d.log", p.runs)))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(bytes.TrimSpace(b))
}

// crashLoop kills the pipeline kills times, each after a random 0.3–2.5 s
// of work, restarting it each time; after two of the kills it seeks the
// input back to since (before the first publish), so every message is
// delivered again; and it leaves the last run going.
//
// progress reports how many keys are through at each kill, to show that
// the kills hit a pipeline at work.
func crashLoop(t *testing.T, e *crashEnv, p *pipelineProc, kills int, inputSub string, since time.Time, rng *rand.Rand, progress func() int) (seeks int) {
	p.start()
	at := make([]string, 0, kills)
	for i := range kills {
		time.Sleep(300*time.Millisecond + time.Duration(rng.Int64N(int64(2200*time.Millisecond))))
		if p.exited() {
			t.Fatalf("run %d exited by itself\n%s", p.runs, p.tail())
		}
		p.kill()
		at = append(at, fmt.Sprint(progress()))
		if i%10 == 4 {
			if err := e.seekTo(inputSub, since); err != nil {
				t.Fatalf("seek: %v", err)
			}
			seeks++
		}
		p.start()
	}
	t.Logf("keys through at each kill: %s", strings.Join(at, " "))
	return seeks
}

func crashKeys(n int, prefix string) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%06d", prefix, i)
	}
	return keys
}

// sinkTable is a PostgreSQL sink table of one test, with a pool on its
// database; the table is dropped when the test ends.
type sinkTable struct {
	db   *pgxpool.Pool
	name string
}

func newSinkTable(t *testing.T, pgURL, prefix string) *sinkTable {
	t.Helper()
	db, err := pgxpool.New(context.Background(), pgURL)
	if err != nil {
		t.Fatal(err)
	}
	st := &sinkTable{db: db, name: fmt.Sprintf("%s_%d", prefix, time.Now().UnixNano())}
	t.Cleanup(func() {
		_, _ = db.Exec(context.Background(), "DROP TABLE IF EXISTS "+st.ident())
		db.Close()
	})
	return st
}

// ident is the table's name quoted for SQL.
func (st *sinkTable) ident() string { return pgx.Identifier{st.name}.Sanitize() }

// count is the table's rows; 0 until the pipeline has created it.
func (st *sinkTable) count() int {
	var c int
	if err := st.db.QueryRow(context.Background(), "SELECT count(*) FROM "+st.ident()).Scan(&c); err != nil {
		return 0
	}
	return c
}

// check asserts that the table holds every key once, each with the
// message ID of one of its published copies, and no other key.
func (st *sinkTable) check(t *testing.T, keys []string, pub *published) {
	t.Helper()
	rows, err := st.db.Query(context.Background(), "SELECT key, message_id FROM "+st.ident())
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	var dup, unexpected, wrongID []string
	for rows.Next() {
		var k, id string
		if err := rows.Scan(&k, &id); err != nil {
			t.Fatal(err)
		}
		if _, ok := got[k]; ok {
			dup = append(dup, k)
		}
		got[k] = id
		ids, ok := pub.ids[k]
		switch {
		case !ok:
			unexpected = append(unexpected, k)
		case !slices.Contains(ids, id):
			wrongID = append(wrongID, fmt.Sprintf("%s=%s (published as %v)", k, id, ids))
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	var missing []string
	for _, k := range keys {
		if _, ok := got[k]; !ok {
			missing = append(missing, k)
		}
	}
	t.Logf("table: %d rows, %d expected keys; missing %d, unexpected %d, twice %d, foreign message ID %d",
		len(got), len(keys), len(missing), len(unexpected), len(dup), len(wrongID))
	for what, list := range map[string][]string{"missing": missing, "unexpected": unexpected, "twice": dup, "with a message ID never published for the key": wrongID} {
		if len(list) > 0 {
			sort.Strings(list)
			t.Errorf("%d keys %s, e.g. %s", len(list), what, strings.Join(list[:min(5, len(list))], ", "))
		}
	}
}
