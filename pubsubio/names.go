// Package pubsubio connects dedupflow to Pub/Sub through the official client:
// resource names, the client (real Pub/Sub with Application Default
// Credentials, or any emulator through PUBSUB_EMULATOR_HOST), and the topic
// sink.
package pubsubio

import (
	"fmt"
	"strings"

	"github.com/dedupflow/dedupflow/limits"
)

// Name is a full resource name split into its parts.
type Name struct {
	Project string
	Kind    string // "topics" or "subscriptions"
	ID      string
}

func (n Name) String() string { return "projects/" + n.Project + "/" + n.Kind + "/" + n.ID }

// TopicName reads a topic given as a short ID, in project, or as
// projects/P/topics/T, in P whatever project is.
func TopicName(project, s string) (Name, error) { return parseName(project, s, "topics") }

// SubscriptionName reads a subscription given as a short ID, in project,
// or as projects/P/subscriptions/S, in P whatever project is.
func SubscriptionName(project, s string) (Name, error) {
	return parseName(project, s, "subscriptions")
}

func parseName(project, s, kind string) (Name, error) {
	single := strings.TrimSuffix(kind, "s")
	if s == "" {
		return Name{}, fmt.Errorf("empty %s name", single)
	}
	n := Name{Project: project, Kind: kind, ID: s}
	if strings.Contains(s, "/") {
		parts := strings.Split(s, "/")
		if len(parts) != 4 || parts[0] != "projects" || parts[2] != kind {
			return Name{}, fmt.Errorf("malformed %s name %q: want an ID or projects/PROJECT/%s/ID", single, s, kind)
		}
		// A full name stands for itself, in whichever project it is:
		// project only completes short IDs.
		n.Project, n.ID = parts[1], parts[3]
	}
	if n.Project == "" {
		return Name{}, fmt.Errorf("%s %q needs a project: pass --project or a full projects/P/%s/ID name", single, s, kind)
	}
	if err := limits.Project(n.Project); err != nil {
		return Name{}, fmt.Errorf("%s %q: %w", single, s, err)
	}
	if err := limits.ID(n.ID); err != nil {
		return Name{}, fmt.Errorf("%s %q: %w", single, s, err)
	}
	return n, nil
}
