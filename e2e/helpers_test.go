package e2e

import (
	"os"
	"testing"

	"github.com/dedupflow/dedupflow/internal/testenv"
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
