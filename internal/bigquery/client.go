// Package bigquery is dedupflow's BigQuery writer, shared by the bigquery
// sink and the broker's BigQuery subscriptions: it connects to BigQuery or
// to a local emulator, reads a table's schema, turns a Pub/Sub message into
// a row of that schema (as a BigQuery subscription does, with its options
// use_table_schema, write_metadata and drop_unknown_fields) and appends
// rows through the Storage Write API's _default stream, saying which row
// failed and why.
//
// Rows go to the _default stream, which is at-least-once: a row whose
// append answered OK is in the table and visible to queries at once, and a
// row whose append failed or went unanswered may or may not be. Present
// tells which keys a table already holds, so a writer that must not append
// a row twice can ask before it writes a row that may have landed.
package bigquery

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"cloud.google.com/go/bigquery"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The environment variables that point the clients at an emulator, as
// PUBSUB_EMULATOR_HOST does for Pub/Sub. Google's Go clients read neither,
// so Open maps them.
const (
	// EnvREST is host:port of the emulator's HTTP API (tables, queries).
	EnvREST = "BIGQUERY_EMULATOR_HOST"
	// EnvStorage is host:port of the emulator's gRPC Storage API, which
	// takes the appends; plaintext, as goccy/bigquery-emulator serves it.
	EnvStorage = "BIGQUERY_STORAGE_EMULATOR_HOST"
)

// Endpoints say where BigQuery is: both empty means Google, with
// Application Default Credentials.
type Endpoints struct {
	REST    string // host:port of an emulator's HTTP API
	Storage string // host:port of an emulator's gRPC Storage API
}

// EndpointsFromEnv reads EnvREST and EnvStorage.
func EndpointsFromEnv() Endpoints {
	return Endpoints{REST: os.Getenv(EnvREST), Storage: os.Getenv(EnvStorage)}
}

// Emulated reports whether the endpoints name an emulator.
func (e Endpoints) Emulated() bool { return e.REST != "" || e.Storage != "" }

// Check refuses endpoints of which only one is set.
func (e Endpoints) Check() error {
	switch {
	case e.REST != "" && e.Storage == "":
		return fmt.Errorf("$%s is set but $%s is not: appends go to the emulator's gRPC Storage API port", EnvREST, EnvStorage)
	case e.REST == "" && e.Storage != "":
		return fmt.Errorf("$%s is set but $%s is not: tables and queries go to the emulator's HTTP port", EnvStorage, EnvREST)
	}
	return nil
}

// Client talks to BigQuery in one project: over REST for tables and
// queries, over gRPC for appends.
type Client struct {
	Project   string
	endpoints Endpoints
	bq        *bigquery.Client
	grpc      []option.ClientOption // for each Writer's own connection
}

// Open connects to BigQuery in project. It checks no credential (Check
// does); opening needs no round trip.
func Open(ctx context.Context, project string, e Endpoints) (*Client, error) {
	if project == "" {
		return nil, errors.New("no project")
	}
	if err := e.Check(); err != nil {
		return nil, err
	}
	var rest, grpcOpts []option.ClientOption
	if e.Emulated() {
		rest = []option.ClientOption{option.WithEndpoint("http://" + e.REST), option.WithoutAuthentication()}
		grpcOpts = []option.ClientOption{
			option.WithEndpoint(e.Storage), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
		}
	}
	bq, err := bigquery.NewClient(ctx, project, rest...)
	if err != nil {
		return nil, fmt.Errorf("credentials: %w", err)
	}
	return &Client{Project: project, endpoints: e, bq: bq, grpc: grpcOpts}, nil
}

// Close closes the REST connection; each Writer closes its own.
func (c *Client) Close() error { return c.bq.Close() }

// Emulated reports whether c talks to an emulator.
func (c *Client) Emulated() bool { return c.endpoints.Emulated() }

// ErrNotFound is a dataset or table that does not exist.
var ErrNotFound = errors.New("not found")

// TableRef names a table in c's project.
type TableRef struct{ Dataset, Table string }

func (r TableRef) String() string { return r.Dataset + "." + r.Table }

// Table reads the table's schema over REST (tables.get). A missing table
// is checked here, not at the first append: the emulator answers an append
// to a missing table with a bare gRPC Unknown, where tables.get says 404.
// A 404 names whether the dataset or the table is missing.
func (c *Client) Table(ctx context.Context, ref TableRef) (*Table, error) {
	md, err := c.bq.Dataset(ref.Dataset).Table(ref.Table).Metadata(ctx)
	if err == nil {
		return newTable(c.Project, ref, md.Schema)
	}
	if !isNotFound(err) {
		return nil, fmt.Errorf("table %s.%s: %w", c.Project, ref, err)
	}
	if _, derr := c.bq.Dataset(ref.Dataset).Metadata(ctx); isNotFound(derr) {
		return nil, fmt.Errorf("dataset %s.%s: %w", c.Project, ref.Dataset, ErrNotFound)
	}
	return nil, fmt.Errorf("table %s.%s: %w", c.Project, ref, ErrNotFound)
}

func isNotFound(err error) bool {
	var ge *googleapi.Error
	return errors.As(err, &ge) && ge.Code == http.StatusNotFound
}
