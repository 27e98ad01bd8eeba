package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxIdentifier is PostgreSQL's NAMEDATALEN-1: longer names are silently
// truncated by the server, so two long names could end up one table.
const maxIdentifier = 63

// ParseTable validates a table name, "table" or "schema.table", and returns
// it as an identifier that is always quoted: any name is safe in SQL, and
// the name is taken literally (case kept, no search for a similar one).
func ParseTable(name string) (pgx.Identifier, error) {
	if name == "" {
		return nil, errors.New("table name is empty")
	}
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table name %q: want TABLE or SCHEMA.TABLE", name)
	}
	for _, p := range parts {
		switch {
		case p == "":
			return nil, fmt.Errorf("table name %q has an empty part", name)
		case len(p) > maxIdentifier:
			return nil, fmt.Errorf("table name %q: %q is longer than PostgreSQL's %d bytes", name, p, maxIdentifier)
		}
		if err := textOK(p); err != nil {
			return nil, fmt.Errorf("table name %q: %w", name, err)
		}
	}
	return pgx.Identifier(parts), nil
}

// column is one column the sink writes, with the types it accepts.
type column struct {
	name  string
	types []string // as format_type() spells them
	ddl   string
}

// columns is the table's shape. key is text (not a hash) so people can
// look rows up by the key they published; data is bytea so every payload,
// binary or not, is stored byte for byte; data_json holds the same payload
// as jsonb when it is JSON, for queries and indexes.
var columns = []column{
	{"key", []string{"text", "character varying"}, "key text PRIMARY KEY"},
	{"message_id", []string{"text", "character varying"}, "message_id text NOT NULL"},
	{"data", []string{"bytea"}, "data bytea NOT NULL"},
	{"data_json", []string{"jsonb"}, "data_json jsonb"},
	{"attributes", []string{"jsonb"}, "attributes jsonb NOT NULL"},
	{"event_time", []string{"timestamp with time zone"}, "event_time timestamptz NOT NULL"},
	{"publish_time", []string{"timestamp with time zone"}, "publish_time timestamptz NOT NULL"},
	{"written_at", []string{"timestamp with time zone"}, "written_at timestamptz NOT NULL DEFAULT now()"},
}

// createDDL is the CREATE TABLE statement for t.
func createDDL(t pgx.Identifier) string {
	defs := make([]string, len(columns))
	for i, c := range columns {
		defs[i] = c.ddl
	}
	return "CREATE TABLE IF NOT EXISTS " + t.Sanitize() + " (\n  " + strings.Join(defs, ",\n  ") + "\n)"
}

// ensureTable creates t when absent and checks the shape of what is there.
// It reports whether it created the table.
func ensureTable(ctx context.Context, pool *pgxpool.Pool, t pgx.Identifier) (bool, error) {
	oid, err := tableOID(ctx, pool, t)
	if err != nil {
		return false, err
	}
	created := false
	if oid == 0 {
		if _, err := pool.Exec(ctx, createDDL(t)); err != nil {
			// Two sinks starting at once both see no table; the loser's
			// CREATE fails on the catalog's unique index. The table is
			// there then, which is all we wanted.
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || (pe.Code != "23505" && pe.Code != "42P07") {
				return false, fmt.Errorf("create table %s: %w", t.Sanitize(), classify(err))
			}
		} else {
			created = true
		}
		if oid, err = tableOID(ctx, pool, t); err != nil {
			return false, err
		}
		if oid == 0 {
			return false, fmt.Errorf("table %s is still missing after CREATE TABLE", t.Sanitize())
		}
	}
	return created, checkShape(ctx, pool, t, oid)
}

func tableOID(ctx context.Context, pool *pgxpool.Pool, t pgx.Identifier) (uint32, error) {
	var oid *uint32
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::oid", t.Sanitize()).Scan(&oid); err != nil {
		return 0, fmt.Errorf("look up table %s: %w", t.Sanitize(), classify(err))
	}
	if oid == nil {
		return 0, nil
	}
	return *oid, nil
}

// checkShape returns an error naming every column that is missing or has
// the wrong type, an unwritable extra column, or a key without the unique
// index ON CONFLICT (key) needs. Checking at start turns a mistake into one
// clear message instead of an error on every batch.
func checkShape(ctx context.Context, pool *pgxpool.Pool, t pgx.Identifier, oid uint32) error {
	rows, err := pool.Query(ctx, `
SELECT a.attname, format_type(a.atttypid, NULL), a.attnotnull, a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> ''
FROM pg_attribute a
WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped`, oid)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", t.Sanitize(), classify(err))
	}
	type have struct {
		typ                string
		notNull, defaulted bool
	}
	got := map[string]have{}
	var extra []string
	for rows.Next() {
		var name string
		var h have
		if err := rows.Scan(&name, &h.typ, &h.notNull, &h.defaulted); err != nil {
			rows.Close()
			return fmt.Errorf("read columns of %s: %w", t.Sanitize(), err)
		}
		got[name] = h
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read columns of %s: %w", t.Sanitize(), classify(err))
	}
	var problems []string
	want := map[string]bool{}
	for _, c := range columns {
		want[c.name] = true
		h, ok := got[c.name]
		if !ok {
			problems = append(problems, fmt.Sprintf("column %q is missing (want %s)", c.name, c.types[0]))
			continue
		}
		if !slices.Contains(c.types, h.typ) {
			problems = append(problems, fmt.Sprintf("column %q is %s, want %s", c.name, h.typ, strings.Join(c.types, " or ")))
		}
	}
	for name, h := range got {
		if !want[name] && h.notNull && !h.defaulted {
			extra = append(extra, name)
		}
	}
	slices.Sort(extra)
	for _, name := range extra {
		problems = append(problems, fmt.Sprintf("extra column %q is NOT NULL without a default, so no row can be inserted", name))
	}
	if len(problems) == 0 {
		var unique bool
		err := pool.QueryRow(ctx, `
SELECT EXISTS (
  SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
  WHERE i.indrelid = $1 AND i.indisunique AND i.indnkeyatts = 1
    AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = 'key')`, oid).Scan(&unique)
		if err != nil {
			return fmt.Errorf("read indexes of %s: %w", t.Sanitize(), classify(err))
		}
		if !unique {
			problems = append(problems, `column "key" has no PRIMARY KEY or UNIQUE constraint of its own (ON CONFLICT (key) needs one)`)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("table %s has the wrong shape: %s", t.Sanitize(), strings.Join(problems, "; "))
	}
	return nil
}
