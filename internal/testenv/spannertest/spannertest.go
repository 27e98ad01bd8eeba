// Package spannertest gives a test a fresh database on the Cloud Spanner
// emulator, which starts empty: an instance, then a database with the
// test's tables.
package spannertest

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	database "cloud.google.com/go/spanner/admin/database/apiv1"
	"cloud.google.com/go/spanner/admin/database/apiv1/databasepb"
	instance "cloud.google.com/go/spanner/admin/instance/apiv1"
	"cloud.google.com/go/spanner/admin/instance/apiv1/instancepb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// Project and Instance are where the databases live.
const (
	Project  = "dedupflow-test"
	Instance = "test"
)

var seq atomic.Int64

// Database creates a database with ddl on the emulator (skipping t without
// one) and returns its name, projects/P/instances/I/databases/D. It is
// dropped when the test ends.
func Database(t testing.TB, ddl ...string) string {
	t.Helper()
	testenv.SpannerEmulator(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ia, err := instance.NewInstanceAdminClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ia.Close()
	op, err := ia.CreateInstance(ctx, &instancepb.CreateInstanceRequest{
		Parent:     "projects/" + Project,
		InstanceId: Instance,
		Instance: &instancepb.Instance{
			Config:      "projects/" + Project + "/instanceConfigs/emulator-config",
			DisplayName: Instance,
			NodeCount:   1,
		},
	})
	if err == nil {
		_, err = op.Wait(ctx)
	}
	if err != nil && status.Code(err) != codes.AlreadyExists {
		t.Fatalf("create instance: %v", err)
	}
	da, err := database.NewDatabaseAdminClient(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Database IDs: 2-30 characters, a letter first.
	id := fmt.Sprintf("t%d-%d", time.Now().UnixNano()%1e12, seq.Add(1))
	dop, err := da.CreateDatabase(ctx, &databasepb.CreateDatabaseRequest{
		Parent:          "projects/" + Project + "/instances/" + Instance,
		CreateStatement: "CREATE DATABASE `" + id + "`",
		ExtraStatements: ddl,
	})
	if err != nil {
		da.Close()
		t.Fatalf("create database: %v", err)
	}
	db, err := dop.Wait(ctx)
	if err != nil {
		da.Close()
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		_ = da.DropDatabase(context.Background(), &databasepb.DropDatabaseRequest{Database: db.Name})
		da.Close()
	})
	return db.Name
}
