// Package testenv tells tests where the real servers started by scripts/test.sh
// listen. A test that needs a server fails when it is missing; it never skips,
// so a CI run without the server is red, not quietly green.
package testenv

import (
	"os"
	"testing"
)

func need(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		t.Fatalf("%s is not set: this test needs %s; run it through scripts/test.sh, which starts it", name, what)
	}
	return v
}

// RedisURL is a redis:// URL of a running Redis server.
func RedisURL(t testing.TB) string { return need(t, "DEDUPFLOW_REDIS_URL", "a Redis server") }

// RedisServer is the path of the redis-server binary, for tests that start
// and stop a server of their own.
func RedisServer(t testing.TB) string {
	return need(t, "DEDUPFLOW_REDIS_SERVER", "the redis-server binary")
}

// PostgresURL is a connection URL of a running PostgreSQL server.
func PostgresURL(t testing.TB) string {
	return need(t, "DEDUPFLOW_POSTGRES_URL", "a PostgreSQL server")
}

// EmulatorHost is host:port of Google's official Pub/Sub emulator.
func EmulatorHost(t testing.TB) string {
	return need(t, "DEDUPFLOW_EMULATOR_HOST", "Google's official Pub/Sub emulator")
}

// Chromium is the path of a Chromium binary for browser tests.
func Chromium(t testing.TB) string { return need(t, "DEDUPFLOW_CHROMIUM", "Chromium") }

// NodeDir is a folder whose node_modules holds the official Node Pub/Sub client.
func NodeDir(t testing.TB) string {
	return need(t, "DEDUPFLOW_NODE_DIR", "the official Node Pub/Sub client (npm install in testdata/node)")
}
