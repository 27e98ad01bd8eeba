package testenv

import "testing"

// SpannerEmulator is host:port of Google's Cloud Spanner emulator. It also
// sets SPANNER_EMULATOR_HOST for the test, which is how the Spanner
// clients (the sink's and the admin ones) find it.
func SpannerEmulator(t testing.TB) string {
	t.Helper()
	h := need(t, "DEDUPFLOW_SPANNER_EMULATOR_HOST", "Google's Cloud Spanner emulator")
	t.Setenv("SPANNER_EMULATOR_HOST", h)
	return h
}

// BigtableEmulator is host:port of Google's Bigtable emulator (cbtemulator).
// It also sets BIGTABLE_EMULATOR_HOST for the test, which is how the
// Bigtable clients find it.
func BigtableEmulator(t testing.TB) string {
	t.Helper()
	h := need(t, "DEDUPFLOW_BIGTABLE_EMULATOR_HOST", "Google's Bigtable emulator")
	t.Setenv("BIGTABLE_EMULATOR_HOST", h)
	return h
}
