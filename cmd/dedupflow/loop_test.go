package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestPipelineRefusesItsOwnInput: a pipeline whose output topic is the
// topic it reads, through its subscription or directly, would read its
// own output for ever: it is refused at start, naming the topic and what
// to do.
func TestPipelineRefusesItsOwnInput(t *testing.T) {
	startInput(t)
	for _, in := range [][]string{{"--input-subscription", "input-sub"}, {"--input-topic", "input"}} {
		// A pipeline that starts runs until the deadline.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		args := append([]string{"pipeline", "--project", "test", "--metrics-addr", "", "--output-topic", "input"}, in...)
		var stdout, stderr testenv.Buffer
		err := run(ctx, args, &stdout, &stderr)
		cancel()
		if err == nil || !strings.Contains(err.Error(), "--output-topic projects/test/topics/input is the topic the pipeline reads") ||
			!strings.Contains(err.Error(), "give another output topic") {
			t.Errorf("pipeline %s --output-topic input: %v, want it refused naming the topic\n%s", strings.Join(in, " "), err, &stderr)
		}
	}
}
