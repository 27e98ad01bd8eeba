package broker

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestNodeClientRoundTrip runs testdata/node/roundtrip.js with the official
// Node client (installed by scripts/test.sh) against our broker.
func TestNodeClientRoundTrip(t *testing.T) {
	nodeDir := testenv.NodeDir(t)
	node := testenv.Tool(t, "node")
	script, err := filepath.Abs(filepath.Join("..", "testdata", "node", "roundtrip.js"))
	if err != nil {
		t.Fatal(err)
	}
	tg := startOurs(t, Options{Now: time.Now})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, script)
	cmd.Dir = nodeDir
	cmd.Env = append(os.Environ(),
		"PUBSUB_EMULATOR_HOST="+tg.addr,
		"NODE_PATH="+filepath.Join(nodeDir, "node_modules"),
		fmt.Sprintf("ROUNDTRIP_SUFFIX=%d", time.Now().UnixNano()))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("roundtrip.js: %v\n%s", err, out)
	}
	if n := strings.Count(string(out), `"lang":"node"`); n != 5 {
		t.Errorf("roundtrip.js printed %d messages, want 5:\n%s", n, out)
	}
}
