package bigquery

// These tests run against goccy/bigquery-emulator. It proves the rows and
// their columns, the start-up checks, the dead-lettering of a message that
// does not fit, the lookup that keeps a retaken key from a second row, and
// that the shipped view runs and hides extra rows. It cannot prove what the
// design does not rely on: it ignores stream offsets and _CHANGE_TYPE.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigquery"

	bq "github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/internal/testenv/sinktest"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/sink/columns"
)

const sub = "projects/p/subscriptions/in"

// orders is a table of JSON orders with every metadata column, the key
// named eid.
var orders = bigquery.Schema{
	{Name: "order_id", Type: bigquery.StringFieldType},
	{Name: "qty", Type: bigquery.IntegerFieldType},
	{Name: "eid", Type: bigquery.StringFieldType, Required: true},
	{Name: "message_id", Type: bigquery.StringFieldType},
	{Name: "publish_time", Type: bigquery.TimestampFieldType},
	{Name: "attributes", Type: bigquery.JSONFieldType},
	{Name: "data", Type: bigquery.BytesFieldType},
	{Name: "subscription_name", Type: bigquery.StringFieldType},
}

type fixture struct {
	c       *bq.Client
	url     string
	project string
	dataset string
}

func newFixture(t testing.TB) fixture {
	t.Helper()
	project := testenv.BigQuery(t)
	c, err := bq.Open(t.Context(), project, bq.EndpointsFromEnv())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ds := fmt.Sprintf("s%d", time.Now().UnixNano())
	if err := c.CreateDataset(t.Context(), ds); err != nil {
		t.Fatal(err)
	}
	return fixture{c, "bigquery://" + project + "/" + ds, project, ds}
}

func (f fixture) table(t testing.TB, name string, s bigquery.Schema) {
	t.Helper()
	if err := f.c.CreateTable(t.Context(), bq.TableRef{Dataset: f.dataset, Table: name}, s); err != nil {
		t.Fatal(err)
	}
}

func (f fixture) open(t testing.TB, o Options) *Sink {
	t.Helper()
	o.Endpoints, o.Subscription, o.Logger = bq.EndpointsFromEnv(), sub, testenv.Logger()
	if o.Metadata == (columns.Metadata{}) {
		o.Metadata = columns.All("eid")
	}
	s, err := Open(t.Context(), f.url, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func (f fixture) query(t *testing.T, q string) [][]bigquery.Value {
	t.Helper()
	rows, err := f.c.Query(t.Context(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return rows
}

// writeAll writes ms, as the pipeline would: the messages whose append
// the emulator refused as locked (another package's test writing at the
// same moment) are written again, and each message's last error is
// returned.
func writeAll(t testing.TB, s *Sink, ms []*sink.Message) []error {
	t.Helper()
	errs := make([]error, len(ms))
	todo := ms
	at := make([]int, len(ms))
	for i := range at {
		at[i] = i
	}
	for try := 0; len(todo) > 0 && try < 6; try++ {
		part := make([]error, len(todo))
		s.WriteBatch(t.Context(), todo, part)
		var next []*sink.Message
		var nextAt []int
		for j, err := range part {
			errs[at[j]] = err
			if bq.Locked(err) {
				next, nextAt = append(next, todo[j]), append(nextAt, at[j])
			}
		}
		todo, at = next, nextAt
	}
	return errs
}

func order(i int) *sink.Message {
	return &sink.Message{
		ID: fmt.Sprint("m", i), Key: fmt.Sprint("k", i),
		Data:        fmt.Appendf(nil, `{"order_id":"o%d","qty":%d,"note":"dropped"}`, i, i),
		Attributes:  map[string]string{"eid": fmt.Sprint("k", i)},
		PublishTime: time.Date(2026, 3, 1, 12, 0, i, 0, time.UTC),
	}
}

func TestWriteBatch(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	s := f.open(t, Options{Table: "orders"})
	var ms []*sink.Message
	for i := range 10 {
		ms = append(ms, order(i))
	}
	ms[4].Data = []byte(`{"order_id":"o4","qty":"four"}`)
	errs := writeAll(t, s, ms)
	for i, err := range errs {
		if i == 4 {
			if !errors.Is(err, sink.ErrPermanent) || !strings.Contains(err.Error(), "column qty") {
				t.Errorf("the order with qty \"four\": %v, want ErrPermanent naming column qty", err)
			}
			continue
		}
		if err != nil {
			t.Errorf("message %d: %v", i, err)
		}
	}
	got := f.query(t, fmt.Sprintf("SELECT order_id, qty, eid, message_id, publish_time, JSON_VALUE(attributes, '$.eid'), subscription_name, data IS NULL FROM `%s` WHERE eid = 'k7'", s.Table()))
	want := fmt.Sprint([]bigquery.Value{"o7", int64(7), "k7", "m7", time.Date(2026, 3, 1, 12, 0, 7, 0, time.UTC), "k7", sub, false})
	if len(got) != 1 || fmt.Sprint(got[0]) != want {
		t.Errorf("row of k7 = %v, want %v", got, want)
	}
	if n := f.query(t, fmt.Sprintf("SELECT COUNT(*) FROM `%s`", s.Table()))[0][0]; n != int64(9) {
		t.Errorf("%v rows, want 9", n)
	}
}

// A retaken key is looked up before it is written again: the crash that
// left its row costs no second row, and a retaken key that never landed is
// still written.
func TestRetakenLookedUp(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	s := f.open(t, Options{Table: "orders"})
	first := []*sink.Message{order(1), order(2), order(3)}
	if err := errors.Join(writeAll(t, s, first)...); err != nil {
		t.Fatal(err)
	}
	// The same keys redelivered after a crash, in another batch with
	// another message; messages 1 and 2 retaken, 4 retaken but new.
	again := []*sink.Message{order(2), order(4), order(1), order(5)}
	for _, i := range []int{0, 1, 2} {
		again[i].Retaken = true
	}
	if err := errors.Join(writeAll(t, s, again)...); err != nil {
		t.Fatal(err)
	}
	rows := f.query(t, fmt.Sprintf("SELECT eid, COUNT(*) FROM `%s` GROUP BY eid ORDER BY eid", s.Table()))
	if fmt.Sprint(rows) != "[[k1 1] [k2 1] [k3 1] [k4 1] [k5 1]]" {
		t.Errorf("rows per key = %v, want each of k1..k5 once", rows)
	}
	if st := s.Stats(); st.Appended != 5 || st.Present != 2 || st.Lookups < 1 {
		t.Errorf("stats = %+v, want 5 appended, 2 found present, a lookup", st)
	}
}

// Two copies of a key in one batch make one row, and both are written.
func TestCopiesInOneBatch(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	s := f.open(t, Options{Table: "orders"})
	again := order(1)
	again.ID = "m1-again"
	if err := errors.Join(writeAll(t, s, []*sink.Message{order(1), order(2), again})...); err != nil {
		t.Fatal(err)
	}
	rows := f.query(t, fmt.Sprintf("SELECT eid, message_id FROM `%s` ORDER BY eid", s.Table()))
	if fmt.Sprint(rows) != "[[k1 m1] [k2 m2]]" {
		t.Errorf("rows = %v, want k1 once (its first copy, m1) and k2", rows)
	}
}

// Without the lookup (a key not marked retaken) a re-write is a second
// row: the shipped view shows it once, with the first publish.
func TestDedupViewHidesExtras(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	s := f.open(t, Options{Table: "orders"})
	m := order(1)
	for range 2 {
		if err := writeAll(t, s, []*sink.Message{m})[0]; err != nil {
			t.Fatal(err)
		}
		m = order(1)
		m.ID, m.PublishTime = "m1-again", m.PublishTime.Add(time.Second)
	}
	if err := writeAll(t, s, []*sink.Message{order(2)})[0]; err != nil {
		t.Fatal(err)
	}
	// The shipped view, and its form without QUALIFY that the docs give too.
	for _, view := range []string{
		DedupView(s.Table(), "eid", "publish_time"),
		fmt.Sprintf("SELECT * EXCEPT(rn) FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY eid ORDER BY publish_time) AS rn FROM `%s`) WHERE rn = 1", s.Table()),
	} {
		rows := f.query(t, "SELECT eid, message_id FROM ("+view+") ORDER BY eid")
		if fmt.Sprint(rows) != "[[k1 m1] [k2 m2]]" {
			t.Errorf("%s = %v, want k1 once (its first message, m1) and k2", view, rows)
		}
	}
	if n := f.query(t, fmt.Sprintf("SELECT COUNT(*) FROM `%s`", s.Table()))[0][0]; n != int64(3) {
		t.Errorf("table holds %v rows, want 3 (one extra)", n)
	}
}

// A table of metadata columns only takes any payload as it is.
func TestMetadataOnly(t *testing.T) {
	f := newFixture(t)
	f.table(t, "raw", bigquery.Schema{{Name: "eid", Type: bigquery.StringFieldType}, {Name: "data", Type: bigquery.BytesFieldType}})
	md, err := columns.Parse("key,data", "eid")
	if err != nil {
		t.Fatal(err)
	}
	s := f.open(t, Options{Table: "raw", Metadata: md})
	if err := writeAll(t, s, []*sink.Message{{ID: "m", Key: "k", Data: []byte{0xff, 0}}})[0]; err != nil {
		t.Fatal(err)
	}
	rows := f.query(t, fmt.Sprintf("SELECT eid, TO_HEX(data) FROM `%s`", s.Table()))
	if fmt.Sprint(rows) != "[[k ff00]]" {
		t.Errorf("rows = %v, want [[k ff00]]", rows)
	}
}

// Each start-up check fails with one line that names what to fix.
func TestOpenChecks(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	f.table(t, "nokey", orders[:2])
	f.table(t, "badtype", bigquery.Schema{{Name: "eid", Type: bigquery.StringFieldType}, {Name: "publish_time", Type: bigquery.IntegerFieldType}})
	keyOff, err := columns.Parse("data", "eid")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		url, table string
		md         columns.Metadata
		fields     []string
		want       string
	}{
		{"bigquery://" + f.project, "orders", columns.All("eid"), nil, "want bigquery://PROJECT/DATASET"},
		{"bigquery://" + f.project + "/nosuchdataset", "orders", columns.All("eid"), nil, "dataset " + f.project + ".nosuchdataset: not found"},
		{f.url, "nosuchtable", columns.All("eid"), nil, "table " + f.project + "." + f.dataset + ".nosuchtable: not found"},
		{f.url, "nokey", columns.All("eid"), nil, "has no column eid"},
		{f.url, "badtype", columns.Metadata{Names: [6]string{"eid", "", "publish_time"}}, nil, "column publish_time is INTEGER, which cannot hold a time"},
		{f.url, "orders", keyOff, nil, "--metadata-columns must include key"},
		{f.url, "orders", columns.All("eid"), []string{"colour"}, "has no column colour"},
	} {
		_, err := Open(t.Context(), tc.url, Options{Table: tc.table, Metadata: tc.md, Fields: tc.fields, Endpoints: bq.EndpointsFromEnv()})
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Open(%s, %s) = %v, want one line with %q", tc.url, tc.table, err, tc.want)
		}
	}
}

// relocked writes as the pipeline would: again while the emulator refuses
// an append as locked by another package's test.
type relocked struct{ *Sink }

func (r relocked) Write(ctx context.Context, m *sink.Message) error {
	err := r.Sink.Write(ctx, m)
	for try := 1; try < 6 && bq.Locked(err); try++ {
		err = r.Sink.Write(ctx, m)
	}
	return err
}

// TestWritesGathered: Writes that arrive together, as a receiver that
// hands over one message at a time makes them, share appends; each row is
// written once, and a Write after Close is refused.
func TestWritesGathered(t *testing.T) {
	f := newFixture(t)
	f.table(t, "orders", orders)
	s := f.open(t, Options{Table: "orders"})
	const n = 200
	ms := make([]*sink.Message, n)
	for i := range ms {
		ms[i] = order(i)
	}
	if err := errors.Join(sinktest.WriteEach(t.Context(), relocked{s}, ms, n)...); err != nil {
		t.Fatal(err)
	}
	rows := f.query(t, fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT eid) FROM `%s`", s.Table()))
	if fmt.Sprint(rows) != fmt.Sprint([][]bigquery.Value{{int64(n), int64(n)}}) {
		t.Errorf("rows, keys = %v after %d Writes of distinct keys, want %d of each", rows, n, n)
	}
	if st := s.Stats(); st.Appended != n || st.Appends >= n/2 {
		t.Errorf("%d Writes took %d appends of %d rows, want fewer than half as many appends as Writes", n, st.Appends, st.Appended)
	}
	s.Close()
	if err := s.Write(t.Context(), ms[0]); !errors.Is(err, ErrClosed) {
		t.Errorf("Write after Close = %v, want ErrClosed", err)
	}
}
