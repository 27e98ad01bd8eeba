package testenv

import "testing"

// The Spanner and Bigtable tests find their emulators where the official
// clients do, in SPANNER_EMULATOR_HOST and BIGTABLE_EMULATOR_HOST (host:port):
// scripts/test.sh exports both, a contributor running an emulator of their
// own has them set already, and a dedupflow binary a test starts inherits
// them.

// SpannerEmulator is host:port of Google's Cloud Spanner emulator.
func SpannerEmulator(t testing.TB) string {
	t.Helper()
	return need(t, "SPANNER_EMULATOR_HOST", "Google's Cloud Spanner emulator")
}

// BigtableEmulator is host:port of Google's Bigtable emulator (cbtemulator).
func BigtableEmulator(t testing.TB) string {
	t.Helper()
	return need(t, "BIGTABLE_EMULATOR_HOST", "Google's Bigtable emulator")
}
