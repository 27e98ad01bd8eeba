package pubsubio

import (
	"errors"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/limits"
)

// A full resource name stands for itself, in any project; the project
// given only completes a short ID.
func TestNames(t *testing.T) {
	for _, tc := range []struct {
		project, s string
		topic      bool
		want       string
		err        string
	}{
		{project: "home", s: "events", topic: true, want: "projects/home/topics/events"},
		{project: "home", s: "projects/home/topics/events", topic: true, want: "projects/home/topics/events"},
		{project: "home", s: "projects/central/topics/events", topic: true, want: "projects/central/topics/events"},
		{project: "", s: "projects/central/topics/events", topic: true, want: "projects/central/topics/events"},
		{project: "home", s: "projects/central/subscriptions/events-sub", want: "projects/central/subscriptions/events-sub"},
		{project: "home", s: "events-sub", want: "projects/home/subscriptions/events-sub"},
		{project: "", s: "events", topic: true, err: `topic "events" needs a project: pass --project or a full projects/P/topics/ID name`},
		{project: "home", s: "projects/central/subscriptions/s1", topic: true, err: "malformed topic name"},
		{project: "home", s: "projects/central/topics/events", err: "malformed subscription name"},
		{project: "home", s: "projects//topics/events", topic: true, err: "needs a project"},
		{project: "home", s: "", topic: true, err: "empty topic name"},
		{project: "home", s: "projects/central/topics/goog-events", topic: true, err: `must not start with "goog"`},
		{project: "home", s: "ab", err: "3 to 255 characters"},
	} {
		parse, kind := SubscriptionName, "subscription"
		if tc.topic {
			parse, kind = TopicName, "topic"
		}
		n, err := parse(tc.project, tc.s)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s %q with project %q: %v, want an error saying %q", kind, tc.s, tc.project, err, tc.err)
			}
			continue
		}
		if err != nil || n.String() != tc.want {
			t.Errorf("%s %q with project %q: %v, %v; want %s", kind, tc.s, tc.project, n, err, tc.want)
		}
	}
	if _, err := TopicName("home", "1events"); !errors.Is(err, limits.ErrID) {
		t.Errorf("an ID that starts with a digit: %v, want limits.ErrID", err)
	}
	for _, project := range []string{"P!", "My-Project"} {
		if _, err := TopicName(project, "events"); !errors.Is(err, limits.ErrProject) {
			t.Errorf("project %q: %v, want limits.ErrProject", project, err)
		}
	}
	if _, err := SubscriptionName("home", "projects/P!/subscriptions/events"); !errors.Is(err, limits.ErrProject) {
		t.Errorf("a full name in project P!: %v, want limits.ErrProject", err)
	}
}
