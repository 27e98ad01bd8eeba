package bigtable

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigtable"

	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/bigtabletest"
	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

const sub = "projects/p/subscriptions/orders"

func open(t *testing.T, table string, o Options) *Sink {
	t.Helper()
	o.Table, o.Subscription, o.Logger = table, sub, testenv.Logger()
	if o.Metadata == (columns.Metadata{}) {
		o.Metadata = columns.All("eid")
	}
	s, err := Open(context.Background(), bigtabletest.URL, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

var published = time.Date(2026, 1, 2, 3, 4, 5, 678901234, time.UTC)

func order(key, id string, at time.Time) *sink.Message {
	return &sink.Message{ID: id, Key: key, PublishTime: at, EventTime: at,
		Attributes: map[string]string{"eid": key, "region": "eu"},
		Data:       fmt.Appendf(nil, `{"customer":"ann","amount":%d}`, len(key))}
}

func write(t *testing.T, s *Sink, ms ...*sink.Message) []error {
	t.Helper()
	errs := make([]error, len(ms))
	s.WriteBatch(context.Background(), ms, errs)
	return errs
}

// TestRewriteLeavesOneCell: writing a batch again, and a republished copy
// of a key (a new message ID, a later publish time), leaves one row per
// key with one cell per column, the copy's.
func TestRewriteLeavesOneCell(t *testing.T) {
	table := bigtabletest.Table(t, DefaultFamily)
	s := open(t, table, Options{Fields: []string{"customer", "amount"}})
	var ms []*sink.Message
	for i := range 50 {
		ms = append(ms, order(fmt.Sprintf("k%02d", i), fmt.Sprint("m", i), published))
	}
	for range 2 {
		for i, err := range write(t, s, ms...) {
			if err != nil {
				t.Fatalf("message %d: %v", i, err)
			}
		}
	}
	if errs := write(t, s, order("k07", "m7-copy", published.Add(time.Minute))); errs[0] != nil {
		t.Fatal(errs[0])
	}
	rows := bigtabletest.Cells(t, table)
	if len(rows) != 50 {
		t.Errorf("%d rows after writing 50 keys twice and a copy, want 50", len(rows))
	}
	for key, cols := range rows {
		if len(cols) != 8 {
			t.Errorf("row %s has %d columns, want 8: %v", key, len(cols), cols)
		}
		for col, n := range cols {
			if n != 1 {
				t.Errorf("row %s column %s has %d cells, want 1", key, col, n)
			}
		}
	}
	c, err := bigtable.NewClient(context.Background(), bigtabletest.Project, bigtabletest.Instance)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r, err := c.Open(table).ReadRow(context.Background(), "k07")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, it := range r[DefaultFamily] {
		got[strings.TrimPrefix(it.Column, DefaultFamily+":")] = string(it.Value)
		if want := bigtable.Time(published.Add(time.Minute).Truncate(time.Millisecond)); it.Timestamp != want {
			t.Errorf("cell %s at %v, want %v (the event time in milliseconds)", it.Column, it.Timestamp.Time(), want.Time())
		}
	}
	want := map[string]string{"eid": "k07", "message_id": "m7-copy", "publish_time": "2026-01-02T03:05:05.678901234Z",
		"attributes": `{"eid":"k07","region":"eu"}`, "data": `{"customer":"ann","amount":3}`, "subscription_name": sub,
		"customer": "ann", "amount": "3"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("row k07:\n got %v\nwant %v", got, want)
	}
}

// TestBadMessages: a message that cannot be a row fails alone, as
// permanent, saying why; the others of its batch are written.
func TestBadMessages(t *testing.T) {
	table := bigtabletest.Table(t, DefaultFamily)
	rk, err := ParseRowKey("{attributes.region}#{data.customer}#{key}")
	if err != nil {
		t.Fatal(err)
	}
	s := open(t, table, Options{RowKey: rk})
	noRegion := order("k2", "m2", published)
	delete(noRegion.Attributes, "region")
	long := order(strings.Repeat("k", 5000), "m4", published)
	ms := []*sink.Message{order("k1", "m1", published), noRegion, {ID: "m3", Key: "k3", Data: []byte("payload-3"), Attributes: map[string]string{"region": "eu"}}, long, order("k5", "m5", published)}
	want := []string{"", "row key: no attribute region", `payload is not a JSON object, so it has no field "customer"`, "row key is 5007 bytes, over Bigtable's 4096", ""}
	for i, err := range write(t, s, ms...) {
		switch {
		case want[i] == "" && err != nil:
			t.Errorf("message %d: %v", i, err)
		case want[i] != "" && (err == nil || !errors.Is(err, sink.ErrPermanent) || !strings.Contains(err.Error(), want[i])):
			t.Errorf("message %d: %v, want a permanent error saying %q", i, err, want[i])
		}
	}
	rows := bigtabletest.Cells(t, table)
	if _, ok := rows["eu#ann#k1"]; !ok || len(rows) != 2 {
		t.Errorf("rows %v, want eu#ann#k1 and eu#ann#k5", rows)
	}
}

// TestMutationLimit: a batch is cut into requests of at most MaxMutations,
// counted as Bigtable counts them: the family's clearing and each cell.
func TestMutationLimit(t *testing.T) {
	table := bigtabletest.Table(t, DefaultFamily)
	md, _ := columns.Parse("key,message_id", "eid")
	s := open(t, table, Options{Metadata: md, MaxMutations: 10}) // 3 a row: 3 rows a request
	var ms []*sink.Message
	for i := range 10 {
		ms = append(ms, order(fmt.Sprint("k", i), fmt.Sprint(i), published))
	}
	for _, err := range write(t, s, ms...) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if st := s.Stats(); st.Requests != 4 || st.Rows != 10 {
		t.Errorf("stats %+v, want 10 rows in 4 requests", st)
	}
}

// TestOpenRefuses: a missing table or family is one line at start.
func TestOpenRefuses(t *testing.T) {
	table := bigtabletest.Table(t, "other")
	for _, tc := range []struct {
		name, url, table string
		o                Options
		want             string
	}{
		{"no table", bigtabletest.URL, "nope", Options{Metadata: columns.All("eid")}, "table nope does not exist (create it with the column family cf"},
		{"no family", bigtabletest.URL, table, Options{Metadata: columns.All("eid")}, "table " + table + " has no column family cf"},
		{"nothing to write", bigtabletest.URL, table, Options{Family: "other"}, "no cells to write"},
		{"bad url", "bigtable://projects/p", table, Options{}, "want bigtable://projects/P/instances/I"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.Table = tc.table
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

// TestOpenWithoutCredentials: credentials that cannot be read are one line
// at start, naming them, and the sink does not start.
func TestOpenWithoutCredentials(t *testing.T) {
	t.Setenv("BIGTABLE_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", filepath.Join(t.TempDir(), "key.json"))
	_, err := Open(context.Background(), "bigtable://projects/p/instances/i", Options{Table: "t", Fields: []string{"a"}})
	if err == nil || !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), "credentials: ") || !strings.Contains(err.Error(), "key.json") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open: %v, want one line refusing the credentials", err)
	}
}

// TestWritesGathered: Writes that arrive together, as a receiver that
// hands over one message at a time makes them, share MutateRows requests;
// each row is written once, and a Write after Close is refused.
func TestWritesGathered(t *testing.T) {
	table := bigtabletest.Table(t, DefaultFamily)
	s := open(t, table, Options{Fields: []string{"customer", "amount"}})
	const n = 200
	ms := make([]*sink.Message, n)
	for i := range ms {
		ms[i] = order(fmt.Sprintf("k%03d", i), fmt.Sprint("m", i), published)
	}
	if err := errors.Join(sinktest.WriteEach(context.Background(), s, ms, n)...); err != nil {
		t.Fatal(err)
	}
	if rows := bigtabletest.Cells(t, table); len(rows) != n {
		t.Errorf("%d rows after %d Writes of distinct keys, want %d", len(rows), n, n)
	}
	if st := s.Stats(); st.Rows != n || st.Requests >= n/2 {
		t.Errorf("%d Writes took %d requests of %d rows, want fewer than half as many requests as Writes", n, st.Requests, st.Rows)
	}
	s.Close()
	if err := s.Write(context.Background(), ms[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}
