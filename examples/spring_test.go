package examples

import (
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

var (
	reTomcat   = regexp.MustCompile(`Tomcat started on port (\d+)`)
	reReceived = regexp.MustCompile(`(?m)^received ".*$`)
)

// TestSpringTutorialApp does what the tutorial's reader does: it starts
// `dedupflow up` and the tutorial's Spring Cloud Stream app pointed at it
// by the emulator host alone, sends Message 1 with key 123 and Messages 2,
// 3 and 4 with key 456 through the app's web form, and sees the app's
// consumer print Message 1 and Message 2 only, while the console counts
// the two republishes.
func TestSpringTutorialApp(t *testing.T) {
	jar := testenv.SpringTutorialJar(t)
	java := testenv.Tool(t, "java")
	bin := buildDedupflow(t)

	up := start(t, nil, bin, "up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0",
		"--metrics-addr", "127.0.0.1:0")
	broker := up.waitFor(t, reEmulator, 30*time.Second)
	console := up.waitFor(t, reConsole, 30*time.Second)

	app := start(t, nil, java, "-jar", jar,
		"--spring.cloud.gcp.pubsub.emulator-host="+broker, "--server.port=0")
	form := "http://127.0.0.1:" + app.waitFor(t, reTomcat, 3*time.Minute) + "/"
	app.waitFor(t, regexp.MustCompile(`(Started App) in`), time.Minute)

	for _, m := range []struct{ message, key string }{
		{"Message 1", "123"}, {"Message 2", "456"}, {"Message 3", "456"}, {"Message 4", "456"},
	} {
		resp, err := http.PostForm(form, url.Values{"message": {m.message}, "key": {m.key}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("posting %q to the form: %s", m.message, resp.Status)
		}
	}

	got := waitCounts(t, console, time.Minute, func(c consoleCounts) bool { return c.Received == 4 })
	if got.Emitted != 2 || got.Republish != 2 || got.Redelivery != 0 {
		t.Errorf("console counts %+v, want 4 received, 2 emitted, 2 republishes", got)
	}
	// The pipeline emitted two; the app prints what it receives.
	app.waitFor(t, regexp.MustCompile(`(?s)(received.*received)`), time.Minute)
	printed := reReceived.FindAllString(app.out.String(), -1)
	slices.Sort(printed)
	if want := []string{`received "Message 1" key=123`, `received "Message 2" key=456`}; !slices.Equal(printed, want) {
		t.Errorf("the app printed %q, want %q", printed, want)
	}

	// A JVM stopped by SIGTERM runs its shutdown hooks and exits 143.
	if code := app.stop(t, syscall.SIGTERM); code != 143 {
		t.Errorf("the app exited %d after SIGTERM, want 143:\n%s", code, app.out.String())
	}
	if code := up.stop(t, syscall.SIGINT); code != 0 {
		t.Errorf("dedupflow up exited %d after Ctrl-C, want 0:\n%s", code, up.out.String())
	}
	if s := app.out.String(); strings.Contains(s, " ERROR ") {
		t.Errorf("the app logged an error:\n%s", s)
	}
}
