package main

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestPasswordsRedacted: the password of a URL the user gives shows in no
// log line and no error, whether the pipeline starts (pulling or as a push
// endpoint) or refuses the URL.
func TestPasswordsRedacted(t *testing.T) {
	const pw = "s3cretPW"
	r := testenv.StartRedis(t, "--requirepass", pw)
	state := "redis://:" + pw + "@" + r.Addr() + "/0"
	startInput(t)
	base := []string{"pipeline", "--project", "test", "--metrics-addr", "", "--sink", "stdout", "--state", state}

	for _, in := range [][]string{{"--input-subscription", "input-sub"}, {"--input-push", "127.0.0.1:0"}} {
		var stdout, stderr testenv.Buffer
		ctx, cancel := context.WithCancel(context.Background())
		done, exited := make(chan error, 1), make(chan struct{})
		go func() { done <- run(ctx, append(append([]string{}, base...), in...), &stdout, &stderr); close(exited) }()
		line := waitFor(t, "start line", &stderr, &stdout, regexp.MustCompile(`(?m)^(.*msg="pipeline running".*)$`), exited)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("%v: %v", in, err)
		}
		if !strings.Contains(line, "state=redis://:xxxxx@127.0.0.1:") {
			t.Errorf("%v: start line %q: want the state URL with its password masked", in, line)
		}
		if strings.Contains(stderr.String(), pw) {
			t.Errorf("%v: the log holds the password:\n%s", in, &stderr)
		}
	}

	for _, bad := range [][]string{
		{"--state", "redis://:" + pw + "@127.0.0.1:bad/0"},
		{"--state", "postgres://u:" + pw + "@127.0.0.1:5432/db"},
		{"--state", "mem", "--sink", "postgres://u:" + pw + "@127.0.0.1:bad/db"},
		{"--state", "mem", "--sink", "mysql://u:" + pw + "@127.0.0.1/db"},
	} {
		var stdout, stderr testenv.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		err := run(ctx, append(append([]string{}, base...), append(bad, "--input-subscription", "input-sub")...), &stdout, &stderr)
		cancel()
		if err == nil {
			t.Errorf("%v: accepted", bad)
			continue
		}
		if strings.Contains(err.Error(), pw) || strings.Contains(stderr.String(), pw) {
			t.Errorf("%v: the password shows:\nerror: %v\nlog: %s", bad, err, &stderr)
		}
	}
}
