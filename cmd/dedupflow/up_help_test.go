package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestUpHelpNamesTheTutorial: up's help names the tutorial it runs by its
// published title and links it, so a user can read what up acts out.
func TestUpHelpNamesTheTutorial(t *testing.T) {
	var out bytes.Buffer
	_ = runUp(context.Background(), []string{"-h"}, &out, &out)
	for _, want := range []string{
		`"Deduplicate Pub/Sub messages with Dataflow in a Spring Cloud Stream application"`,
		"https://cloud.google.com/community/tutorials/pubsub-spring-dedup-messages",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("dedupflow up -h does not name %s:\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "seed") {
		t.Errorf("dedupflow up -h speaks of a seed tutorial:\n%s", out.String())
	}
}
