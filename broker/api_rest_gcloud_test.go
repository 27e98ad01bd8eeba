package broker

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestGcloud runs one gcloud session against Google's emulator and against
// ours, and compares what gcloud prints. gcloud takes seconds per command,
// so the script is short: it covers what a user does first.
func TestGcloud(t *testing.T) {
	t.Parallel()
	gcloud := testenv.Tool(t, "gcloud")
	emu := testenv.EmulatorHost(t)
	ours := startOurs(t, Options{Now: time.Now}) // gcloud's seek takes wall-clock times
	start := time.Now().Add(-2 * time.Second).UTC().Format(time.RFC3339)
	script := [][]string{
		{"topics", "create", "gc-topic"},
		{"subscriptions", "create", "gc-sub", "--topic", "gc-topic", "--retain-acked-messages"},
		{"topics", "publish", "gc-topic", "--message", "hello, world", "--attribute", "k=v,origin=gcloud"},
		{"subscriptions", "pull", "gc-sub", "--auto-ack", "--format", "json(message.data,message.attributes,ackStatus)"},
		// Acked, retained, then replayed by seeking back.
		{"subscriptions", "seek", "gc-sub", "--time", start, "--format", "value(subscriptionId)"},
		{"subscriptions", "pull", "gc-sub", "--auto-ack", "--format", "json(message.data,message.attributes,ackStatus)"},
		{"subscriptions", "delete", "gc-sub"},
		{"topics", "delete", "gc-topic"},
		{"topics", "describe", "gc-topic"},
	}
	var (
		wg  sync.WaitGroup
		out [2]string
	)
	for i, addr := range []string{emu, ours.addr} {
		wg.Go(func() { out[i] = runGcloud(t, gcloud, addr, unique("gcloud"), script) })
	}
	wg.Wait()
	if out[0] != out[1] {
		t.Fatalf("gcloud printed, against the emulator:\n%s\nagainst ours:\n%s", out[0], out[1])
	}
	for _, want := range []string{"Created topic", "aGVsbG8sIHdvcmxk", `"origin": "gcloud"`, "NOT_FOUND"} {
		if !strings.Contains(out[1], want) {
			t.Errorf("gcloud output lacks %q:\n%s", want, out[1])
		}
	}
}

var (
	notFoundDetail = regexp.MustCompile(`NOT_FOUND: .*`)
	messageID      = regexp.MustCompile(`(?m)^- '[0-9]+'$`)
)

// runGcloud runs the script against addr in a throwaway gcloud
// configuration and returns the transcript, with the project spelled
// PROJECT, message IDs as ID (each server counts its own) and the servers'
// own wording of errors cut after the code.
func runGcloud(t *testing.T, gcloud, addr, proj string, script [][]string) string {
	env := append(os.Environ(),
		"CLOUDSDK_CONFIG="+t.TempDir(),
		"CLOUDSDK_API_ENDPOINT_OVERRIDES_PUBSUB=http://"+addr+"/",
		"CLOUDSDK_AUTH_DISABLE_CREDENTIALS=true",
		"CLOUDSDK_CORE_PROJECT="+proj,
		"CLOUDSDK_CORE_DISABLE_PROMPTS=1",
		"CLOUDSDK_CORE_DISABLE_USAGE_REPORTING=true",
		"CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK=true",
	)
	var b strings.Builder
	for _, args := range script {
		cmd := exec.Command(gcloud, append([]string{"pubsub"}, args...)...)
		cmd.Env = env
		got, err := cmd.CombinedOutput()
		fmt.Fprintf(&b, "$ gcloud pubsub %s\n", strings.Join(args, " "))
		if err != nil {
			fmt.Fprintf(&b, "(failed)\n")
		}
		s := strings.ReplaceAll(string(got), proj, "PROJECT")
		s = notFoundDetail.ReplaceAllString(s, "NOT_FOUND: ...")
		b.WriteString(messageID.ReplaceAllString(s, "- 'ID'"))
	}
	return b.String()
}
