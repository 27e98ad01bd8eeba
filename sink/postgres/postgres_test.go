package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/postgres"
)

// env is a test's server connection and table.
type env struct {
	url   string // with an application_name unique to the test
	app   string
	table string
	admin *pgxpool.Pool
}

var nonWord = regexp.MustCompile(`[^a-z0-9]+`)

func newEnv(t testing.TB) *env {
	t.Helper()
	base := testenv.PostgresURL(t)
	name := nonWord.ReplaceAllString(strings.ToLower(t.Name()), "_")
	if len(name) > 30 {
		name = name[:30]
	}
	e := &env{
		app:   fmt.Sprintf("dft_%s_%d", name, time.Now().UnixNano()%1e9),
		table: fmt.Sprintf("t_%s_%d", name, time.Now().UnixNano()%1e9),
	}
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse DEDUPFLOW_POSTGRES_URL: %v", err)
	}
	q := u.Query()
	q.Set("application_name", e.app)
	u.RawQuery = q.Encode()
	e.url = u.String()
	e.admin, err = pgxpool.New(context.Background(), base)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = e.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{e.table}.Sanitize())
		e.admin.Close()
	})
	return e
}

func (e *env) open(t testing.TB, o postgres.Options) *postgres.Sink {
	t.Helper()
	if o.Table == "" {
		o.Table = e.table
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	s, err := postgres.Open(context.Background(), e.url, o)
	if err != nil {
		t.Fatalf("open sink: %v", err)
	}
	t.Cleanup(s.Close)
	return s
}

// lock holds the table in a transaction that every write waits behind,
// as a hung server would keep it, until the transaction is rolled back (at
// the latest when t ends).
func (e *env) lock(t testing.TB) pgx.Tx {
	t.Helper()
	ctx := context.Background()
	tx, err := e.admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	if _, err := tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{e.table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE"); err != nil {
		t.Fatal(err)
	}
	return tx
}

func (e *env) count(t testing.TB, where string, args ...any) int {
	t.Helper()
	var n int
	q := "SELECT count(*) FROM " + pgx.Identifier{e.table}.Sanitize()
	if where != "" {
		q += " WHERE " + where
	}
	if err := e.admin.QueryRow(context.Background(), q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func msg(key, id, data string) *sink.Message {
	now := time.Now().UTC().Truncate(time.Microsecond)
	return &sink.Message{
		ID: id, Key: key, Data: []byte(data),
		Attributes:  map[string]string{"dedupflow_id": key, "source": "test"},
		PublishTime: now, EventTime: now.Add(-time.Second),
	}
}

// Many writers write overlapping keys at once, as the pipeline's goroutines
// do after a crash replays work: every key ends up exactly once, and every
// Write that returned nil has its row.
func TestConcurrentDuplicateWrites(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	const writers, keys = 64, 3000
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each writer covers a third of the keys, so every key is
			// written by about 21 writers, often in the same batch.
			for k := w % 3; k < keys; k += 3 {
				key := fmt.Sprintf("key-%d", k)
				if err := s.Write(context.Background(), msg(key, fmt.Sprintf("m-%d-%d", k, w), "x")); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("write: %v", err)
	}
	if n := e.count(t, ""); n != keys {
		t.Fatalf("table has %d rows, want %d", n, keys)
	}
	var distinct int
	if err := e.admin.QueryRow(context.Background(),
		"SELECT count(DISTINCT key) FROM "+pgx.Identifier{e.table}.Sanitize()+" WHERE key LIKE 'key-%'").Scan(&distinct); err != nil {
		t.Fatal(err)
	}
	if distinct != keys {
		t.Fatalf("%d distinct keys, want %d", distinct, keys)
	}
	st := s.Stats()
	if st.Inserted != keys || st.Failed != 0 {
		t.Fatalf("stats %+v: want %d inserted, none failed", st, keys)
	}
	if avg := float64(st.Rows) / float64(st.Batches); avg < 2 {
		t.Errorf("average batch %.1f rows: writes are not being coalesced", avg)
	}
	t.Logf("stats %+v, %.1f distinct rows per statement", st, float64(st.Rows)/float64(st.Batches))
}

func TestRowContents(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	ctx := context.Background()
	m := msg("k1", "m1", `{"b": 2, "a": [1, "x"]}`)
	m.Attributes["nul"] = "a\x00b"
	if err := s.Write(ctx, m); err != nil {
		t.Fatal(err)
	}
	var (
		id, dj       string
		data         []byte
		attrs        map[string]any
		ev, pub      time.Time
		writtenAtSet bool
	)
	err := e.admin.QueryRow(ctx, "SELECT message_id, data, data_json::text, attributes, event_time, publish_time, written_at IS NOT NULL FROM "+
		pgx.Identifier{e.table}.Sanitize()+" WHERE key = 'k1'").Scan(&id, &data, &dj, &attrs, &ev, &pub, &writtenAtSet)
	if err != nil {
		t.Fatal(err)
	}
	if id != "m1" || string(data) != string(m.Data) || !ev.Equal(m.EventTime) || !pub.Equal(m.PublishTime) || !writtenAtSet {
		t.Fatalf("row = %q %q %v %v, want %q %q %v %v", id, data, ev, pub, m.ID, m.Data, m.EventTime, m.PublishTime)
	}
	if dj != `{"a": [1, "x"], "b": 2}` {
		t.Fatalf("data_json = %s", dj)
	}
	if attrs["source"] != "test" || attrs["dedupflow_id"] != "k1" {
		t.Fatalf("attributes = %v", attrs)
	}
	// A NUL cannot live in jsonb text: the value is kept, base64-tagged.
	if nul, ok := attrs["nul"].(map[string]any); !ok || nul["base64"] != "YQBi" {
		t.Fatalf("attribute with NUL stored as %#v, want {\"base64\": \"YQBi\"}", attrs["nul"])
	}
}

// Payloads: JSON gets data_json, anything else only data; all bytes are
// kept. Hostile JSON that passes Go's checks but not jsonb's (a number
// beyond numeric's range) must not fail the batch it rides in.
func TestPayloadKinds(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	ctx := context.Background()
	cases := []struct {
		name, data string
		json       bool
	}{
		{"object", `{"n":1}`, true},
		{"array", `[1,2]`, true},
		{"string", `"s"`, true},
		{"text", `hello`, false},
		{"empty", ``, false},
		{"binary", "\xff\x00\x01", false},
		{"nul-escape", `{"a":"\u0000"}`, false},
		{"truncated", `{"a":`, false},
		{"huge-number", `[1e1000000]`, false}, // valid JSON; jsonb's numeric refuses it
	}
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Write(ctx, msg(c.name, "id-"+c.name, c.data)); err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
		}()
	}
	wg.Wait()
	for _, c := range cases {
		var data []byte
		var isJSON bool
		err := e.admin.QueryRow(ctx, "SELECT data, data_json IS NOT NULL FROM "+pgx.Identifier{e.table}.Sanitize()+" WHERE key = $1", c.name).Scan(&data, &isJSON)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if string(data) != c.data || isJSON != c.json {
			t.Errorf("%s: data %q json %v, want %q json %v", c.name, data, isJSON, c.data, c.json)
		}
	}
}

// Input that no table can hold is a permanent error before it reaches a
// batch; a message without a key is keyed on its message ID.
func TestKeys(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	ctx := context.Background()
	for _, m := range []*sink.Message{
		msg("a\x00b", "m1", "x"),
		msg("\xff", "m2", "x"),
		{ID: "m3", Key: "k3", Attributes: map[string]string{"a\x00": "v"}},
		{},
	} {
		if err := s.Write(ctx, m); !errors.Is(err, sink.ErrPermanent) {
			t.Errorf("write %q: err = %v, want ErrPermanent", m.Key, err)
		}
	}
	pass := msg("", "msg-id-7", "x")
	for range 2 {
		if err := s.Write(ctx, pass); err != nil {
			t.Fatal(err)
		}
	}
	if n := e.count(t, "key = 'msg-id-7' AND message_id = 'msg-id-7'"); n != 1 {
		t.Fatalf("message without a key: %d rows keyed on its ID, want 1", n)
	}
	if n := e.count(t, ""); n != 1 {
		t.Fatalf("%d rows, want 1", n)
	}
}

func TestDoUpdate(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{OnConflict: postgres.DoUpdate})
	ctx := context.Background()
	if err := s.Write(ctx, msg("k", "m1", "first")); err != nil {
		t.Fatal(err)
	}
	if err := s.Write(ctx, msg("k", "m2", "second")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, "key = 'k' AND message_id = 'm2' AND data = 'second'"); n != 1 {
		t.Fatal("DO UPDATE: the last write did not win")
	}
	// Copies of one key in one statement would make DO UPDATE fail
	// ("cannot affect row a second time"): they are folded first.
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.Write(ctx, msg(fmt.Sprintf("hot-%d", i%5), fmt.Sprintf("m-%d", i), "v")); err != nil {
				t.Errorf("write: %v", err)
			}
		}()
	}
	wg.Wait()
	if n := e.count(t, "key LIKE 'hot-%'"); n != 5 {
		t.Fatalf("%d hot rows, want 5", n)
	}

	// DO NOTHING keeps the first.
	e2 := newEnv(t)
	s2 := e2.open(t, postgres.Options{})
	_ = s2.Write(ctx, msg("k", "m1", "first"))
	_ = s2.Write(ctx, msg("k", "m2", "second"))
	if n := e2.count(t, "key = 'k' AND message_id = 'm1' AND data = 'first'"); n != 1 {
		t.Fatal("DO NOTHING: the first write did not stay")
	}
}

func TestWrongShape(t *testing.T) {
	ctx := context.Background()
	cases := []struct{ ddl, want string }{
		{`(key text PRIMARY KEY, message_id text)`, `column "data" is missing`},
		{`(key text PRIMARY KEY, message_id text, data text, data_json jsonb, attributes jsonb,
		   event_time timestamptz, publish_time timestamptz, written_at timestamptz DEFAULT now())`, `column "data" is text, want bytea`},
		{`(key text, message_id text, data bytea, data_json jsonb, attributes jsonb,
		   event_time timestamptz, publish_time timestamptz, written_at timestamptz DEFAULT now())`, `no PRIMARY KEY or UNIQUE`},
		{`(key text PRIMARY KEY, message_id text, data bytea, data_json jsonb, attributes json,
		   event_time timestamp, publish_time timestamptz, written_at timestamptz DEFAULT now(), tenant text NOT NULL)`,
			`column "attributes" is json, want jsonb; column "event_time" is timestamp without time zone, want timestamp with time zone; extra column "tenant"`},
	}
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			e := newEnv(t)
			if _, err := e.admin.Exec(ctx, "CREATE TABLE "+pgx.Identifier{e.table}.Sanitize()+" "+c.ddl); err != nil {
				t.Fatal(err)
			}
			_, err := postgres.Open(ctx, e.url, postgres.Options{Table: e.table})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("open: err = %v, want it to say %q", err, c.want)
			}
		})
	}
	// A table with the right shape plus nullable extras is fine.
	e := newEnv(t)
	if _, err := e.admin.Exec(ctx, "CREATE TABLE "+pgx.Identifier{e.table}.Sanitize()+` (key varchar(200) UNIQUE, message_id text, data bytea,
		data_json jsonb, attributes jsonb, event_time timestamptz, publish_time timestamptz, written_at timestamptz DEFAULT now(), note text)`); err != nil {
		t.Fatal(err)
	}
	e.open(t, postgres.Options{})
}

func TestTableNames(t *testing.T) {
	for _, bad := range []string{"", "a.b.c", ".x", "x.", strings.Repeat("n", 64), "a\x00", "\xff"} {
		if _, err := postgres.ParseTable(bad); err == nil {
			t.Errorf("ParseTable(%q) accepted", bad)
		}
	}
	// A name that would be an injection unquoted is just a name.
	e := newEnv(t)
	e.table = `Odd "name"; DROP TABLE x; --` + fmt.Sprint(time.Now().UnixNano()%1e6)
	s := e.open(t, postgres.Options{})
	if err := s.Write(context.Background(), msg("k", "m", "x")); err != nil {
		t.Fatal(err)
	}
	if n := e.count(t, ""); n != 1 {
		t.Fatalf("%d rows in %s", n, s.Table())
	}
	// schema.table
	ctx := context.Background()
	schema := "s_" + fmt.Sprint(time.Now().UnixNano()%1e9)
	if _, err := e.admin.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = e.admin.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE") })
	s2 := e.open(t, postgres.Options{Table: schema + ".events"})
	if err := s2.Write(ctx, msg("k", "m", "x")); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := s.Write(context.Background(), msg(fmt.Sprint(i), "m", "x"))
			if err != nil && !errors.Is(err, postgres.ErrClosed) {
				t.Errorf("write during close: %v", err)
			}
		}()
	}
	s.Close()
	wg.Wait()
	if err := s.Write(context.Background(), msg("late", "m", "x")); !errors.Is(err, postgres.ErrClosed) {
		t.Fatalf("write after close: %v, want ErrClosed", err)
	}
	s.Close() // twice is fine
}

// The server kills every connection of the sink (as a restart or failover
// does): writes fail with ErrUnavailable or succeed, and then all succeed
// again without any help.
func TestConnectionsKilled(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{Flushers: 4})
	ctx := context.Background()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures, written int
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				key := fmt.Sprintf("w%d-%d", w, i)
				for {
					err := s.Write(ctx, msg(key, "m", "x"))
					if err == nil {
						break
					}
					if !errors.Is(err, dedup.ErrUnavailable) {
						t.Errorf("write %s: %v, want ErrUnavailable", key, err)
						return
					}
					mu.Lock()
					failures++
					mu.Unlock()
					time.Sleep(20 * time.Millisecond) // the pipeline backs off too
				}
				mu.Lock()
				written++
				mu.Unlock()
			}
		}()
	}
	killed := 0
	for range 5 {
		time.Sleep(200 * time.Millisecond)
		var n int
		if err := e.admin.QueryRow(ctx, "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", e.app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		killed += n
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	before := written
	mu.Unlock()
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()
	if killed == 0 {
		t.Fatal("no connection of the sink was found to kill")
	}
	if written <= before {
		t.Fatalf("no writes after the last kill (%d before, %d after)", before, written)
	}
	if n := e.count(t, ""); n != written {
		t.Fatalf("%d rows, but %d writes returned nil", n, written)
	}
	t.Logf("killed %d connections; %d writes, %d failed attempts, stats %+v", killed, written, failures, s.Stats())
}

// A statement that cannot finish (here: the table is locked; in life, a
// hung server) times out as ErrUnavailable, and writes resume after.
func TestStatementTimeout(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{StatementTimeout: 300 * time.Millisecond})
	ctx := context.Background()
	if err := s.Write(ctx, msg("before", "m", "x")); err != nil {
		t.Fatal(err)
	}
	tx := e.lock(t)
	start := time.Now()
	err := s.Write(ctx, msg("blocked", "m", "x"))
	if !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("write to a locked table: %v, want ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("write took %v despite a 300ms statement timeout", d)
	}
	_ = tx.Rollback(ctx)
	if err := s.Write(ctx, msg("after", "m", "x")); err != nil {
		t.Fatalf("write after the lock: %v", err)
	}
	// The writer's own deadline ends its wait even if the batch goes on.
	short, cancel := context.WithTimeout(ctx, time.Nanosecond)
	defer cancel()
	<-short.Done()
	if err := s.Write(short, msg("late", "m", "x")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("write with an ended context: %v", err)
	}
}

// A batch ends by its caller's deadline, not by the statement timeout: the
// pipeline gives a write half the claim lease, and a batch that runs past
// it holds keys whose claims may be taken over (the flaky-network run saw
// a batch of two statements, each tried twice, outlast it).
func TestWriteBatchDeadline(t *testing.T) {
	e := newEnv(t)
	const statementTimeout = 20 * time.Second
	s := e.open(t, postgres.Options{StatementTimeout: statementTimeout, MaxBatch: 2})
	ctx := context.Background()
	if err := s.Write(ctx, msg("before", "m", "x")); err != nil {
		t.Fatal(err)
	}
	tx := e.lock(t)
	ms := []*sink.Message{msg("a", "1", "x"), msg("b", "2", "x"), msg("c", "3", "x"), msg("d", "4", "x")}
	errs := make([]error, len(ms))
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.WriteBatch(short, ms, errs)
	if d := time.Since(start); d >= statementTimeout {
		t.Fatalf("a batch with a 300ms deadline took %v, as long as the statement timeout", d)
	}
	for i, err := range errs {
		if !errors.Is(err, dedup.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("message %d of a batch past its deadline: %v, want ErrUnavailable or DeadlineExceeded", i, err)
		}
	}
	_ = tx.Rollback(ctx)
	s.WriteBatch(ctx, ms, errs)
	for i, err := range errs {
		if err != nil {
			t.Errorf("message %d after the lock: %v", i, err)
		}
	}
	if n := e.count(t, "true"); n != 5 {
		t.Errorf("%d rows, want 5", n)
	}
}

func TestDataJSONRoundTrip(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	ctx := context.Background()
	m := msg("k", "m", `{"user":"ü","n":12345678901234567890}`)
	if err := s.Write(ctx, m); err != nil {
		t.Fatal(err)
	}
	var got json.RawMessage
	if err := e.admin.QueryRow(ctx, "SELECT data_json->'n' FROM "+pgx.Identifier{e.table}.Sanitize()).Scan(&got); err != nil {
		t.Fatal(err)
	}
	if string(got) != "12345678901234567890" {
		t.Fatalf("jsonb number = %s (jsonb keeps numerics exact)", got)
	}
}
