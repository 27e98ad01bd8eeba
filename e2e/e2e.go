// Package e2e holds dedupflow's end-to-end tests: the binary, killed and
// restarted under load against real servers (the crash, Redis Cluster
// failover, Redis outage, flaky network, replica and payload tests), and
// the console and broker page of the binary driven from real Chromium. It
// is a module of its own so that what only these tests use (toxiproxy,
// chromedp) stays out of the go.mod of the module users import. Run it from
// the repository's root with go test ./e2e/... (go.work), as
// scripts/test.sh does.
package e2e
