// Package testenv tells tests where the real servers started by
// scripts/test.sh listen. A test that needs a server it cannot find skips,
// with one line naming what to start, so `go test ./...` passes on a
// machine with only Go; with DEDUPFLOW_REQUIRE_SERVERS=1 (scripts/test.sh
// sets it) it fails instead, so a CI run without the server is red, not
// quietly green.
package testenv

import (
	"log/slog"
	"os"
	"os/exec"
	"testing"
)

// Required reports whether tests must fail, not skip, without a server.
func Required() bool { return os.Getenv("DEDUPFLOW_REQUIRE_SERVERS") == "1" }

// Missing skips t, or fails it when servers are required, saying what to
// start or install.
func Missing(t testing.TB, what string) {
	t.Helper()
	Cannot(t, what+"; scripts/test.sh starts it")
}

// Cannot skips t, saying why this machine cannot run it, or fails it when
// servers are required: a CI run where a test cannot prove what it checks
// is red, not quietly green.
func Cannot(t testing.TB, why string) {
	t.Helper()
	if Required() {
		t.Fatalf("%s (DEDUPFLOW_REQUIRE_SERVERS=1)", why)
	}
	t.Skipf("skipped: %s", why)
}

func need(t testing.TB, name, what string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Missing(t, "this test needs "+what+" at $"+name)
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

// StorageEmulatorHost is the URL of a Cloud Storage JSON API server
// (fake-gcs-server), as STORAGE_EMULATOR_HOST takes it.
func StorageEmulatorHost(t testing.TB) string {
	return need(t, "DEDUPFLOW_STORAGE_EMULATOR_HOST", "a Cloud Storage server (fake-gcs-server)")
}

// BigQuery is goccy/bigquery-emulator as the BigQuery clients find it:
// its HTTP and gRPC ports in $BIGQUERY_EMULATOR_HOST and
// $BIGQUERY_STORAGE_EMULATOR_HOST (the test's process already has them),
// and the project it serves.
func BigQuery(t testing.TB) (project string) {
	t.Helper()
	need(t, "BIGQUERY_EMULATOR_HOST", "goccy/bigquery-emulator's HTTP port")
	need(t, "BIGQUERY_STORAGE_EMULATOR_HOST", "goccy/bigquery-emulator's gRPC port")
	return need(t, "BIGQUERY_EMULATOR_PROJECT", "the project goccy/bigquery-emulator serves (its --project; the emulator reads it too)")
}

// Chromium is the path of a Chromium binary for browser tests.
func Chromium(t testing.TB) string { return need(t, "DEDUPFLOW_CHROMIUM", "Chromium") }

// NodeDir is a folder whose node_modules holds the official Node Pub/Sub client.
func NodeDir(t testing.TB) string {
	return need(t, "DEDUPFLOW_NODE_DIR", "the official Node Pub/Sub client (npm install in testdata/node)")
}

// Python is a Python interpreter whose packages hold the official Python
// Pub/Sub client at the versions of testdata/python/requirements.txt (a
// virtual environment scripts/test.sh creates).
func Python(t testing.TB) string {
	return need(t, "DEDUPFLOW_PYTHON", "a Python with testdata/python/requirements.txt installed (a venv)")
}

// SpringTutorialJar is the runnable jar of examples/spring-tutorial, the
// tutorial's Spring Cloud Stream app (mvn package).
func SpringTutorialJar(t testing.TB) string {
	return need(t, "DEDUPFLOW_SPRING_JAR", "the tutorial's Spring app (mvn package in examples/spring-tutorial)")
}

// SpringTutorial2020Jar is the runnable jar of examples/spring-tutorial-2020,
// the same app on the tutorial's Spring Boot 2.2 (mvn package).
func SpringTutorial2020Jar(t testing.TB) string {
	return need(t, "DEDUPFLOW_SPRING2020_JAR", "the tutorial's Spring app on Boot 2.2 (mvn package in examples/spring-tutorial-2020)")
}

// BeamReferenceJar is the runnable jar of examples/beam-reference, the
// tutorial's job on Beam's DirectRunner (mvn package).
func BeamReferenceJar(t testing.TB) string {
	return need(t, "DEDUPFLOW_BEAM_JAR", "the Beam reference pipeline (mvn package in examples/beam-reference)")
}

// Tool is the path of a command-line tool on $PATH (node, gcloud,
// promtool...), installed from Debian's packages by scripts/test.sh.
func Tool(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		Missing(t, "this test needs "+name+" on $PATH")
	}
	return p
}

// Image names the container image built from ./Dockerfile (buildah), whose
// files the deploy tests run.
func Image(t testing.TB) string {
	return need(t, "DEDUPFLOW_IMAGE", "the container image built from ./Dockerfile")
}

// EmulatorAndOurs runs f twice, as subtests: against Google's emulator and
// against the server ours starts, each given as host:port, so one scenario
// is checked side by side with the reference peer.
func EmulatorAndOurs(t *testing.T, ours func(t *testing.T) string, f func(t *testing.T, host string)) {
	t.Run("emulator", func(t *testing.T) { f(t, EmulatorHost(t)) })
	t.Run("ours", func(t *testing.T) { f(t, ours(t)) })
}

// Logger is a test's logger: debug lines on stderr under go test -v,
// nothing otherwise.
func Logger() *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.DiscardHandler)
}
