// Package bigtabletest gives a test a fresh table on the Bigtable
// emulator, which serves any instance but has tables and column families
// only as the admin API creates them.
package bigtabletest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/bigtable"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// Project and Instance are where the tables live; URL names them for the
// sink.
const (
	Project  = "dedupflow-test"
	Instance = "test"
	URL      = "bigtable://projects/" + Project + "/instances/" + Instance
)

var seq atomic.Int64

// Table creates a table with families on the emulator (skipping t without
// one) and returns its name. It is deleted when the test ends.
func Table(t testing.TB, families ...string) string {
	t.Helper()
	testenv.BigtableEmulator(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ac, err := bigtable.NewAdminClient(ctx, Project, Instance)
	if err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("t%d_%d", time.Now().UnixNano(), seq.Add(1))
	if err := ac.CreateTable(ctx, name); err != nil {
		t.Fatalf("create table: %v", err)
	}
	for _, f := range families {
		if err := ac.CreateColumnFamily(ctx, name, f); err != nil {
			t.Fatalf("create column family %s: %v", f, err)
		}
	}
	t.Cleanup(func() {
		_ = ac.DeleteTable(context.Background(), name)
		_ = ac.Close()
	})
	return name
}

// Cells counts the cells of each row and column of table: rows maps a
// row key to its columns' cell counts (family:column).
func Cells(t testing.TB, table string) map[string]map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := bigtable.NewClient(ctx, Project, Instance)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rows := map[string]map[string]int{}
	err = c.Open(table).ReadRows(ctx, bigtable.InfiniteRange(""), func(r bigtable.Row) bool {
		cols := map[string]int{}
		for _, items := range r {
			for _, it := range items {
				cols[it.Column]++
			}
		}
		rows[r.Key()] = cols
		return true
	})
	if err != nil {
		t.Fatalf("read table %s: %v", table, err)
	}
	return rows
}
