// Package pubsubio connects dedupflow to Pub/Sub through the official client:
// resource names, the client (real Pub/Sub with Application Default
// Credentials, or any emulator through PUBSUB_EMULATOR_HOST), and the topic
// sink.
package pubsubio

import (
	"fmt"
	"strings"
)

// Name is a full resource name split into its parts.
type Name struct {
	Project string
	Kind    string // "topics" or "subscriptions"
	ID      string
}

func (n Name) String() string { return "projects/" + n.Project + "/" + n.Kind + "/" + n.ID }

// TopicName reads a topic given as a short ID (with project) or as
// projects/P/topics/T.
func TopicName(project, s string) (Name, error) { return parseName(project, s, "topics") }

// SubscriptionName reads a subscription given as a short ID (with project)
// or as projects/P/subscriptions/S.
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
		n.Project, n.ID = parts[1], parts[3]
		if project != "" && project != n.Project {
			return Name{}, fmt.Errorf("%s %q is in project %q, not in --project %q", single, s, n.Project, project)
		}
	}
	if n.Project == "" {
		return Name{}, fmt.Errorf("%s %q needs a project: pass --project or a full projects/P/%s/ID name", single, s, kind)
	}
	if err := ValidID(n.ID); err != nil {
		return Name{}, fmt.Errorf("%s %q: %w", single, s, err)
	}
	return n, nil
}

// ValidID checks a topic or subscription ID against the service's rules:
// 3 to 255 characters, starting with a letter, of letters, digits and
// - _ . ~ + %, and not starting with "goog".
func ValidID(id string) error {
	if len(id) < 3 || len(id) > 255 {
		return fmt.Errorf("ID must be 3 to 255 characters long, got %d", len(id))
	}
	if c := id[0]; !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
		return fmt.Errorf("ID must start with a letter")
	}
	if strings.HasPrefix(strings.ToLower(id), "goog") {
		return fmt.Errorf("ID must not start with \"goog\"")
	}
	for _, c := range id {
		ok := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.ContainsRune("-_.~+%", c)
		if !ok {
			return fmt.Errorf("ID may hold only letters, digits and - _ . ~ + %%, not %q", c)
		}
	}
	return nil
}
