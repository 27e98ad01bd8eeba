package bigquery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"cloud.google.com/go/bigquery"
	"google.golang.org/api/iterator"
)

// Present returns which of keys the table t holds in column, in one query.
// Rows appended to the _default stream are visible to it as soon as their
// append answered.
func (c *Client) Present(ctx context.Context, t *Table, column string, keys []string) (map[string]bool, error) {
	if t.Column(column) == nil {
		return nil, fmt.Errorf("table %s has no column %s", t, column)
	}
	q := c.bq.Query(fmt.Sprintf("SELECT DISTINCT %s FROM %s WHERE %[1]s IN UNNEST(@keys)", quote(column), quote(t.String())))
	q.Parameters = []bigquery.QueryParameter{{Name: "keys", Value: keys}}
	it, err := q.Read(ctx)
	if err != nil {
		return nil, fmt.Errorf("looking up keys in %s: %w", t, err)
	}
	found := make(map[string]bool)
	for {
		var row []bigquery.Value
		err := it.Next(&row)
		if errors.Is(err, iterator.Done) {
			return found, nil
		}
		if err != nil {
			return nil, fmt.Errorf("looking up keys in %s: %w", t, err)
		}
		if k, ok := row[0].(string); ok {
			found[k] = true
		}
	}
}

// quote is a name as GoogleSQL quotes it, so a column or table named like
// a keyword still works. Backticks cannot appear in BigQuery names.
func quote(name string) string { return "`" + strings.ReplaceAll(name, "`", "") + "`" }

// Query runs q (GoogleSQL) and returns its rows, for checks and tests.
func (c *Client) Query(ctx context.Context, q string) (rows [][]bigquery.Value, err error) {
	err = retryLocked(ctx, func() error {
		rows, err = c.query(ctx, q)
		return err
	})
	return rows, err
}

// retryLocked runs f again, a few times, while the emulator refuses it as
// Locked: the tests' helpers below write from several packages at once.
func retryLocked(ctx context.Context, f func() error) error {
	for try := 1; ; try++ {
		err := f()
		if !Locked(err) || try == 5 {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(try) * 100 * time.Millisecond):
		}
	}
}

func (c *Client) query(ctx context.Context, q string) ([][]bigquery.Value, error) {
	it, err := c.bq.Query(q).Read(ctx)
	if err != nil {
		return nil, err
	}
	var rows [][]bigquery.Value
	for {
		var row []bigquery.Value
		err := it.Next(&row)
		if errors.Is(err, iterator.Done) {
			return rows, nil
		}
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
}

// CreateTable creates a table with schema s, for start-up of a
// tutorial and for tests; the sink never creates one.
func (c *Client) CreateTable(ctx context.Context, ref TableRef, s bigquery.Schema) error {
	return retryLocked(ctx, func() error {
		return c.bq.Dataset(ref.Dataset).Table(ref.Table).Create(ctx, &bigquery.TableMetadata{Schema: s})
	})
}

// CreateDataset creates a dataset, for tests.
func (c *Client) CreateDataset(ctx context.Context, dataset string) error {
	return retryLocked(ctx, func() error { return c.bq.Dataset(dataset).Create(ctx, nil) })
}
