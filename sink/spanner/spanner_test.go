package spanner

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/spanner"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/internal/testenv/spannertest"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

const ordersDDL = `CREATE TABLE orders (
	eid STRING(64) NOT NULL,
	message_id STRING(MAX),
	publish_time TIMESTAMP,
	attributes JSON,
	data BYTES(MAX),
	subscription_name STRING(MAX),
	customer STRING(16),
	amount INT64,
	paid BOOL,
) PRIMARY KEY (eid)`

const sub = "projects/p/subscriptions/orders"

func open(t *testing.T, db string, o Options) *Sink {
	t.Helper()
	if o.Table == "" {
		o.Table = "orders"
	}
	if o.Metadata == (columns.Metadata{}) {
		o.Metadata = columns.All("eid")
	}
	o.Subscription, o.Logger = sub, testenv.Logger()
	s, err := Open(context.Background(), "spanner://"+db, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func order(key, id, customer string, amount int) *sink.Message {
	return &sink.Message{ID: id, Key: key, PublishTime: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Attributes: map[string]string{"eid": key},
		Data:       fmt.Appendf(nil, `{"customer":%q,"amount":%d,"paid":true,"extra":1}`, customer, amount)}
}

func write(t *testing.T, s *Sink, ms ...*sink.Message) []error {
	t.Helper()
	errs := make([]error, len(ms))
	s.WriteBatch(context.Background(), ms, errs)
	return errs
}

// count is the rows of table.
func count(t *testing.T, db, table string) int64 {
	t.Helper()
	c, err := spanner.NewClient(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var n int64
	err = c.Single().Query(context.Background(), spanner.NewStatement("SELECT COUNT(*) FROM "+table)).Do(func(r *spanner.Row) error {
		return r.Columns(&n)
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRewriteIsNoop: writing a batch again, and a republished copy of a
// key (a new message ID), leaves one row per key, holding the fields and
// the metadata.
func TestRewriteIsNoop(t *testing.T) {
	db := spannertest.Database(t, ordersDDL)
	s := open(t, db, Options{})
	var ms []*sink.Message
	for i := range 50 {
		ms = append(ms, order(fmt.Sprintf("k%02d", i), fmt.Sprint("m", i), "ann", i))
	}
	for range 2 {
		for i, err := range write(t, s, ms...) {
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	if errs := write(t, s, order("k07", "m7-copy", "ann", 7)); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if n := count(t, db, "orders"); n != 50 {
		t.Errorf("%d rows after writing 50 keys twice and a copy, want 50", n)
	}
	c, err := spanner.NewClient(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Single().ReadRow(context.Background(), "orders", spanner.Key{"k07"},
		[]string{"message_id", "publish_time", "attributes", "data", "subscription_name", "customer", "amount", "paid"})
	if err != nil {
		t.Fatal(err)
	}
	var (
		id, subName, customer string
		pt                    time.Time
		attrs                 spanner.NullJSON
		data                  []byte
		amount                int64
		paid                  bool
	)
	if err := r.Columns(&id, &pt, &attrs, &data, &subName, &customer, &amount, &paid); err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprintf("%s %v %s %s %s %s %d %v", id, pt, attrs.String(), data, subName, customer, amount, paid)
	want := `m7-copy 2026-01-02 03:04:05.000006 +0000 UTC {"eid":"k07"} {"customer":"ann","amount":7,"paid":true,"extra":1} ` + sub + " ann 7 true"
	if got != want {
		t.Errorf("row k07:\n got %s\nwant %s", got, want)
	}
	if st := s.Stats(); st.Rows != 101 || st.Failed != 0 {
		t.Errorf("stats %+v, want 101 rows and no failed commit", st)
	}
}

// TestBadMessages: a message the table cannot hold fails alone, as
// permanent, naming the column; the others of its batch are written.
func TestBadMessages(t *testing.T) {
	db := spannertest.Database(t, ordersDDL)
	s := open(t, db, Options{})
	bad := func(key, data string) *sink.Message {
		return &sink.Message{ID: key, Key: key, Data: []byte(data)}
	}
	ms := []*sink.Message{
		order("good1", "g1", "ann", 1),
		bad("notjson", "payload-1"),
		bad("type", `{"amount":"lots"}`),
		bad("long", `{"customer":"a name longer than sixteen"}`),
		bad("bool", `{"paid":"yes"}`),
		{ID: "m", Key: strings.Repeat("k", 65), Data: []byte(`{}`)},
		order("good2", "g2", "bob", 2),
	}
	want := []string{"", `no field "customer"`, "column amount: want an INT64", "column customer: 26 characters, over the column's 16",
		"column paid: want true or false", "column eid: 65 characters, over the column's 64", ""}
	errs := write(t, s, ms...)
	for i, err := range errs {
		switch {
		case want[i] == "" && err != nil:
			t.Errorf("message %s: %v", ms[i].Key, err)
		case want[i] != "" && (err == nil || !errors.Is(err, sink.ErrPermanent) || !strings.Contains(err.Error(), want[i])):
			t.Errorf("message %.10s: %v, want a permanent error saying %q", ms[i].Key, err, want[i])
		}
	}
	if n := count(t, db, "orders"); n != 2 {
		t.Errorf("%d rows, want the 2 good ones", n)
	}
}

// TestServerRefusesOneRow: what only the server checks (here a CHECK
// constraint) fails the one row, found by splitting the commit.
func TestServerRefusesOneRow(t *testing.T) {
	db := spannertest.Database(t, `CREATE TABLE orders (eid STRING(MAX) NOT NULL, amount INT64,
		CONSTRAINT positive CHECK (amount > 0)) PRIMARY KEY (eid)`)
	md, _ := columns.Parse("key", "eid")
	s := open(t, db, Options{Metadata: md})
	var ms []*sink.Message
	for i := range 9 {
		amount := i + 1
		if i == 8 {
			amount = -1
		}
		ms = append(ms, &sink.Message{ID: fmt.Sprint(i), Key: fmt.Sprint("k", i), Data: fmt.Appendf(nil, `{"amount":%d}`, amount)})
	}
	errs := write(t, s, ms...)
	for i, err := range errs {
		if (err != nil) != (i == 8) || err != nil && !errors.Is(err, sink.ErrPermanent) {
			t.Errorf("message %d (amount %s): %v; want only the last, negative, to fail as permanent", i, ms[i].Data, err)
		}
	}
	if n := count(t, db, "orders"); n != 8 {
		t.Errorf("%d rows, want 8", n)
	}
}

// TestMutationLimit: a batch is cut into commits of at most MaxMutations,
// counted as Spanner counts them, a column of a row each.
func TestMutationLimit(t *testing.T) {
	db := spannertest.Database(t, ordersDDL)
	md, _ := columns.Parse("key", "eid")
	s := open(t, db, Options{Metadata: md, Fields: []string{"customer", "amount"}, MaxMutations: 10}) // 3 columns: 3 rows a commit
	var ms []*sink.Message
	for i := range 10 {
		ms = append(ms, order(fmt.Sprint("k", i), fmt.Sprint(i), "c", i))
	}
	for _, err := range write(t, s, ms...) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Commits != 4 || st.Rows != 10 {
		t.Errorf("stats %+v, want 10 rows in 4 commits", st)
	}
}

// TestOpenRefuses: what does not fit is one line at start, naming it.
func TestOpenRefuses(t *testing.T) {
	db := spannertest.Database(t, ordersDDL, `CREATE TABLE typed (eid INT64 NOT NULL, data BYTES(MAX)) PRIMARY KEY (eid)`,
		`CREATE TABLE keyed (id STRING(MAX) NOT NULL, eid STRING(MAX), note STRING(MAX) NOT NULL) PRIMARY KEY (id)`)
	keyOnly, _ := columns.Parse("key", "eid")
	for _, tc := range []struct {
		name, url string
		o         Options
		want      string
	}{
		{"no table", "", Options{Table: "nope"}, "table nope does not exist"},
		{"no column", "", Options{Metadata: columns.All("key")}, "table orders has no column key for the key metadata"},
		{"no field column", "", Options{Metadata: keyOnly, Fields: []string{"total"}}, "table orders has no column total for the field"},
		{"metadata type", "", Options{Table: "typed", Metadata: keyOnly}, "column eid of table typed is INT64; the key metadata needs STRING"},
		{"key not written", "", Options{Table: "keyed", Metadata: keyOnly, Fields: []string{"note"}}, "primary key column id is neither"},
		{"not null not written", "", Options{Table: "keyed", Metadata: keyOnly, Fields: []string{"id"}}, "column note of table keyed is NOT NULL but not written"},
		{"no database", "spanner://projects/" + spannertest.Project + "/instances/" + spannertest.Instance + "/databases/nope", Options{}, "Database not found"},
		{"bad url", "spanner://projects/p/databases/d", Options{}, "want spanner://projects/P/instances/I/databases/D"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.url == "" {
				tc.url = "spanner://" + db
			}
			if tc.o.Table == "" {
				tc.o.Table = "orders"
			}
			if tc.o.Metadata == (columns.Metadata{}) {
				tc.o.Metadata = columns.All("eid")
			}
			s, err := Open(context.Background(), tc.url, tc.o)
			if err == nil {
				s.Close()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("Open: %v, want one line saying %q", err, tc.want)
			}
			t.Log(err)
		})
	}
}

// TestConcurrentBatches: the pipeline writes a batch per stream at once.
// Transactional Applies fail that way on the emulator ("Invalid
// transaction ID", not retried by the client); the sink's at-least-once
// commits all go through.
func TestConcurrentBatches(t *testing.T) {
	db := spannertest.Database(t, ordersDDL)
	s := open(t, db, Options{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for b := range 5 {
				var ms []*sink.Message
				for i := range 20 {
					ms = append(ms, order(fmt.Sprintf("g%d-b%d-%d", g, b, i), "m", "ann", i))
				}
				for _, err := range write(t, s, ms...) {
					if err != nil {
						failed.Add(1)
						t.Log(err)
					}
				}
			}
		})
	}
	wg.Wait()
	if n := count(t, db, "orders"); n != 800 || failed.Load() > 0 {
		t.Errorf("%d rows and %d failed writes after 8 writers wrote 40 batches of 20, want 800 and none", n, failed.Load())
	}
}

// TestOpenWithoutCredentials: credentials that cannot be read are one line
// at start, naming them, and the sink does not start.
func TestOpenWithoutCredentials(t *testing.T) {
	t.Setenv("SPANNER_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "key.json"))
	_, err := Open(context.Background(), "spanner://projects/p/instances/i/databases/d", Options{Table: "t"})
	if err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "credentials: ") || !strings.Contains(err.Error(), "key.json") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open: %v, want one line refusing the credentials", err)
	}
}

// TestWritesGathered: Writes that arrive together, as a receiver that
// hands over one message at a time makes them, share commits; each row is
// written once, and a Write after Close is refused.
func TestWritesGathered(t *testing.T) {
	db := spannertest.Database(t, ordersDDL)
	s := open(t, db, Options{})
	const n = 200
	ms := make([]*sink.Message, n)
	for i := range ms {
		ms[i] = order(fmt.Sprintf("k%03d", i), fmt.Sprint("m", i), "ann", i)
	}
	if err := errors.Join(sinktest.WriteEach(context.Background(), s, ms, n)...); err != nil {
		t.Fatal(err)
	}
	if got := count(t, db, "orders"); got != n {
		t.Errorf("%d rows after %d Writes of distinct keys, want %d", got, n, n)
	}
	if st := s.Stats(); st.Rows != n || st.Commits >= n/2 {
		t.Errorf("%d Writes took %d commits of %d rows, want fewer than half as many commits as Writes", n, st.Commits, st.Rows)
	}
	s.Close()
	if err := s.Write(context.Background(), ms[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}
