package spanner

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"cloud.google.com/go/spanner"

	"github.com/dedupflow/dedupflow/sink/columns"
)

// typ is a column's type as INFORMATION_SCHEMA.COLUMNS.SPANNER_TYPE spells
// it, split into its base and length: STRING(64) is {"STRING", 64}.
type typ struct {
	base string
	max  int // characters of a STRING, bytes of a BYTES; 0: MAX or none
}

func parseType(s string) typ {
	base, arg, ok := strings.Cut(s, "(")
	t := typ{base: base}
	if ok {
		t.max, _ = strconv.Atoi(strings.TrimSuffix(arg, ")")) // MAX leaves 0
	}
	return t
}

// scalar are the base types a field may be written to.
var scalar = []string{"STRING", "BYTES", "INT64", "FLOAT64", "FLOAT32", "BOOL", "TIMESTAMP", "DATE", "NUMERIC", "JSON"}

// metaTypes are the base types each metadata column may have.
var metaTypes = map[columns.Kind][]string{
	columns.Key:          {"STRING"},
	columns.MessageID:    {"STRING"},
	columns.Subscription: {"STRING"},
	columns.PublishTime:  {"TIMESTAMP"},
	columns.Attributes:   {"JSON", "STRING"},
	columns.Data:         {"BYTES", "STRING"},
}

// column is one column the sink writes: a metadata column (meta true) or
// a field of the payload of the same name.
type column struct {
	name     string
	typ      typ
	nullable bool
	meta     bool
	kind     columns.Kind // for a metadata column
}

// tableColumn is a column as INFORMATION_SCHEMA describes it.
type tableColumn struct {
	typ       typ
	nullable  bool
	generated bool
}

// plan reads the table's schema and decides what the sink writes: every
// metadata column of md, then the fields (by default, every other column
// the table lets a writer set). Anything that does not fit is one error,
// naming the table and the column, before the first message.
func plan(ctx context.Context, c *spanner.Client, table string, md columns.Metadata, fields []string) ([]column, error) {
	cols, order, err := readColumns(ctx, c, table)
	if err != nil {
		return nil, err
	}
	if len(order) == 0 {
		return nil, fmt.Errorf("%w: table %s does not exist (create it first; see docs/sink-spanner.md)", ErrRefused, table)
	}
	var out []column
	for _, mc := range md.Columns() {
		tc, ok := cols[mc.Name]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: table %s has no column %s for the %s metadata (add it, or leave it out of --metadata-columns)", ErrRefused, table, mc.Name, mc.Kind)
		case tc.generated:
			return nil, fmt.Errorf("%w: column %s of table %s is generated, so the %s metadata cannot be written to it", ErrRefused, mc.Name, table, mc.Kind)
		case !slices.Contains(metaTypes[mc.Kind], tc.typ.base):
			return nil, fmt.Errorf("%w: column %s of table %s is %s; the %s metadata needs %s", ErrRefused, mc.Name, table, tc.typ.base, mc.Kind, strings.Join(metaTypes[mc.Kind], " or "))
		}
		out = append(out, column{name: mc.Name, typ: tc.typ, nullable: tc.nullable, meta: true, kind: mc.Kind})
	}
	if len(fields) == 0 {
		for _, n := range order {
			if !md.Has(n) && !cols[n].generated {
				fields = append(fields, n)
			}
		}
	}
	for _, f := range fields {
		tc, ok := cols[f]
		switch {
		case !ok:
			return nil, fmt.Errorf("%w: table %s has no column %s for the field of that name (see --fields)", ErrRefused, table, f)
		case tc.generated:
			return nil, fmt.Errorf("%w: column %s of table %s is generated; leave it out of --fields", ErrRefused, f, table)
		case !slices.Contains(scalar, tc.typ.base):
			return nil, fmt.Errorf("%w: column %s of table %s is %s, which the sink does not write (it writes %s)", ErrRefused, f, table, tc.typ.base, strings.Join(scalar, ", "))
		}
		out = append(out, column{name: f, typ: tc.typ, nullable: tc.nullable})
	}
	keys, err := primaryKey(ctx, c, table)
	if err != nil {
		return nil, err
	}
	for _, k := range keys {
		if !slices.ContainsFunc(out, func(c column) bool { return c.name == k }) {
			return nil, fmt.Errorf("%w: table %s's primary key column %s is neither a metadata column nor a field written (see --metadata-columns and --fields)", ErrRefused, table, k)
		}
	}
	for _, n := range order {
		if tc := cols[n]; !tc.nullable && !tc.generated && !slices.ContainsFunc(out, func(c column) bool { return c.name == n }) {
			return nil, fmt.Errorf("%w: column %s of table %s is NOT NULL but not written (see --metadata-columns and --fields)", ErrRefused, n, table)
		}
	}
	return out, nil
}

// readColumns reads the table's columns; order is empty when the table
// does not exist.
func readColumns(ctx context.Context, c *spanner.Client, table string) (map[string]tableColumn, []string, error) {
	st := spanner.Statement{
		SQL: `SELECT COLUMN_NAME, SPANNER_TYPE, IS_NULLABLE, IS_GENERATED FROM INFORMATION_SCHEMA.COLUMNS
		      WHERE TABLE_SCHEMA = '' AND TABLE_NAME = @table ORDER BY ORDINAL_POSITION`,
		Params: map[string]any{"table": table},
	}
	cols := map[string]tableColumn{}
	var order []string
	err := c.Single().Query(ctx, st).Do(func(r *spanner.Row) error {
		var name, typeName, nullable, generated string
		if err := r.Columns(&name, &typeName, &nullable, &generated); err != nil {
			return err
		}
		cols[name] = tableColumn{typ: parseType(typeName), nullable: nullable == "YES", generated: generated != "NEVER"}
		order = append(order, name)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("reading the schema of table %s: %w", table, classify(err))
	}
	return cols, order, nil
}

// primaryKey is the table's primary key columns.
func primaryKey(ctx context.Context, c *spanner.Client, table string) ([]string, error) {
	st := spanner.Statement{
		SQL: `SELECT COLUMN_NAME FROM INFORMATION_SCHEMA.INDEX_COLUMNS
		      WHERE TABLE_SCHEMA = '' AND TABLE_NAME = @table AND INDEX_NAME = 'PRIMARY_KEY' ORDER BY ORDINAL_POSITION`,
		Params: map[string]any{"table": table},
	}
	var keys []string
	err := c.Single().Query(ctx, st).Do(func(r *spanner.Row) error {
		var k string
		err := r.Columns(&k)
		keys = append(keys, k)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading the primary key of table %s: %w", table, classify(err))
	}
	return keys, nil
}
