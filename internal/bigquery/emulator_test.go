package bigquery

// These tests run against goccy/bigquery-emulator, a real server speaking
// BigQuery's REST API and the Storage Write API's AppendRows. What it
// proves: the client setup, the schema read over REST, the proto rows it
// decodes into columns, the query that finds keys, and a request limit
// learned from its refusal (it takes 4 MiB). What it cannot: it ignores
// stream offsets and it reports no per-row errors, so neither
// offset-based deduplication nor RowError is exercised here.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/bigquery"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// emulator connects to the emulator and makes a dataset of the test's own.
func emulator(t *testing.T) (*Client, string) {
	t.Helper()
	project := testenv.BigQuery(t)
	ctx := t.Context()
	c, err := Open(ctx, project, EndpointsFromEnv())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	ds := fmt.Sprintf("t%d", time.Now().UnixNano())
	if err := c.CreateDataset(ctx, ds); err != nil {
		t.Fatal(err)
	}
	return c, ds
}

// tableWriter creates the table ref with schema s and opens a writer to
// it, closed when t ends.
func tableWriter(t *testing.T, c *Client, ref TableRef, s bigquery.Schema) (*Table, *Writer) {
	t.Helper()
	ctx := t.Context()
	if err := c.CreateTable(ctx, ref, s); err != nil {
		t.Fatal(err)
	}
	tb, err := c.Table(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.NewWriter(ctx, tb, 0, testenv.Logger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return tb, w
}

// appendAll appends rows, sending again those the emulator refused as
// Locked, and fails t on any other error.
func appendAll(t *testing.T, w *Writer, rows [][]byte) {
	t.Helper()
	idx := make([]int, len(rows))
	for i := range idx {
		idx[i] = i
	}
	for try := 0; len(idx) > 0; try++ {
		batch := make([][]byte, len(idx))
		for j, i := range idx {
			batch[j] = rows[i]
		}
		var again []int
		for j, err := range w.Append(t.Context(), batch) {
			switch {
			case err == nil:
			case Locked(err) && try < 5:
				again = append(again, idx[j])
			default:
				t.Fatalf("row %d: %.300v", idx[j], err)
			}
		}
		idx = again
	}
}

func count(t *testing.T, c *Client, q string) int64 {
	t.Helper()
	rows, err := c.Query(t.Context(), q)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return rows[0][0].(int64)
}

func TestTableMissing(t *testing.T) {
	c, ds := emulator(t)
	ctx := t.Context()
	_, err := c.Table(ctx, TableRef{"nosuchdataset", "x"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "dataset "+c.Project+".nosuchdataset") {
		t.Errorf("missing dataset: %v, want ErrNotFound naming the dataset", err)
	}
	_, err = c.Table(ctx, TableRef{ds, "nosuchtable"})
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "table "+c.Project+"."+ds+".nosuchtable") {
		t.Errorf("missing table: %v, want ErrNotFound naming the table", err)
	}
}

func TestAppendAndPresent(t *testing.T) {
	c, ds := emulator(t)
	ctx := t.Context()
	tb, w := tableWriter(t, c, TableRef{ds, "events"}, events)
	pt := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	var rows [][]byte
	for i := range 20 {
		b, err := tb.Encode(Row{
			Data: fmt.Appendf(nil, `{"id":"e%d","n":%d,"place":{"city":"Oslo"},"tags":["a"],"doc":{"i":%[2]d}}`, i, i),
			Meta: Metadata("projects/p/subscriptions/s", fmt.Sprint("m", i), pt, map[string]string{"i": fmt.Sprint(i)}),
		}, Options{UseTableSchema: true})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, b)
	}
	appendAll(t, w, rows)
	q := fmt.Sprintf("SELECT COUNT(*) FROM `%s` WHERE n = 7 AND place.city = 'Oslo' AND publish_time = TIMESTAMP '2026-03-01 12:00:00 UTC' AND message_id = 'm7'", tb)
	if n := count(t, c, q); n != 1 {
		t.Errorf("%s = %d, want 1: the row's columns did not arrive as written", q, n)
	}
	if n := count(t, c, fmt.Sprintf("SELECT COUNT(*) FROM `%s`", tb)); n != 20 {
		t.Errorf("%d rows, want 20", n)
	}
	var got map[string]bool
	err := retryLocked(ctx, func() (err error) {
		got, err = c.Present(ctx, tb, "id", []string{"e3", "e19", "nope"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["e3"] || !got["e19"] {
		t.Errorf("Present = %v, want e3 and e19", got)
	}
}

// A writer sized for the service (10 MB) meets the emulator's 4 MiB limit:
// the refused request wrote nothing, the writer learns the limit from the
// refusal and sends the rows again in smaller requests, each row once.
func TestAppendLearnsServerLimit(t *testing.T) {
	c, ds := emulator(t)
	ctx := t.Context()
	s := bigquery.Schema{{Name: "k", Type: bigquery.StringFieldType}, {Name: "data", Type: bigquery.BytesFieldType}}
	tb, w := tableWriter(t, c, TableRef{ds, "big"}, s)
	const n = 60 // 60 rows of 100 KiB: 6 MiB, one request at the service's limit
	var rows [][]byte
	for i := range n {
		b, err := tb.Encode(Row{Meta: []Value{{"k", fmt.Sprint("k", i)}, {"data", make([]byte, 100<<10)}}}, Options{})
		if err != nil {
			t.Fatal(err)
		}
		rows = append(rows, b)
	}
	appendAll(t, w, rows)
	if got := w.MaxRequest(); got >= MaxRequestBytes {
		t.Errorf("MaxRequest = %d after the emulator's refusal, want its limit", got)
	}
	q := fmt.Sprintf("SELECT COUNT(*), COUNT(DISTINCT k) FROM `%s`", tb)
	r, err := c.Query(ctx, q)
	if err != nil {
		t.Fatal(err)
	}
	if r[0][0] != int64(n) || r[0][1] != int64(n) {
		t.Errorf("%s = %v, want %d rows, each once", q, r[0], n)
	}
	// A row that no request can carry fails alone.
	huge, err := tb.Encode(Row{Meta: []Value{{"k", "huge"}, {"data", make([]byte, w.MaxRequest())}}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	errs := w.Append(ctx, [][]byte{rows[0], huge})
	if (errs[0] != nil && !Locked(errs[0])) || !errors.Is(errs[1], ErrTooLarge) {
		t.Errorf("Append(small, huge) = %v, want nil and ErrTooLarge", errs)
	}
}

func TestOpenChecksEndpoints(t *testing.T) {
	ctx := context.Background()
	for _, e := range []Endpoints{{REST: "127.0.0.1:1"}, {Storage: "127.0.0.1:1"}} {
		if _, err := Open(ctx, "p", e); err == nil || !strings.Contains(err.Error(), "is set but") {
			t.Errorf("Open(%+v) = %v, want an error naming the missing variable", e, err)
		}
	}
}

// Without an emulator and without credentials, Open fails at once with
// one line that says so, naming the file but no secret.
func TestOpenWithoutCredentials(t *testing.T) {
	missing := t.TempDir() + "/none.json"
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", missing)
	_, err := Open(t.Context(), "p", Endpoints{})
	if err == nil || !strings.HasPrefix(err.Error(), "credentials: ") || strings.Contains(err.Error(), "\n") {
		t.Errorf("Open without credentials = %v, want one line starting with credentials:", err)
	}
}
