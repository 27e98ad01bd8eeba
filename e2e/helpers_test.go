package e2e

import (
	"context"
	"os"
	"testing"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pubsubio"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveBuilds()
	os.Exit(code)
}

// buildBinary builds dedupflow once per test run and mode (testenv.Build).
func buildBinary(t *testing.T, race bool) string {
	t.Helper()
	return testenv.Build(t, testenv.DedupflowCommand, race)
}

// listenBroker starts the embedded broker on a free loopback port and
// leaves the process environment alone: each command gets the address in
// its own, so the tests run in parallel.
func listenBroker(t *testing.T) string {
	t.Helper()
	addr, stop, err := broker.NewTestServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr
}

// dialBroker is a client for project on the broker at addr.
func dialBroker(t *testing.T, addr, project string) *pubsub.Client {
	t.Helper()
	c, err := pubsub.NewClient(context.Background(), project, pubsubio.Insecure(addr)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}
