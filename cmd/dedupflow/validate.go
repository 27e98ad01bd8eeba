package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/dedupflow/dedupflow/store"
)

// checkAttribute checks an attribute name given in a flag against what
// Pub/Sub accepts, so a bad name fails at start instead of on every message.
func checkAttribute(flag, name string) error {
	switch {
	case name == "":
		return nil
	case len(name) > 256:
		return fmt.Errorf("--%s is %d bytes long; Pub/Sub attribute names are at most 256", flag, len(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("--%s %q is not valid UTF-8", flag, name)
	case strings.HasPrefix(strings.ToLower(name), "goog"):
		return fmt.Errorf("--%s %q: attribute names starting with \"goog\" are reserved by Pub/Sub", flag, name)
	}
	return nil
}

func (j *job) checkAttributes() error {
	for _, a := range []struct{ flag, name string }{
		{"id-attribute", j.idAttr}, {"output-id-attribute", j.outIDAttr},
		{"producer-attribute", j.producerAttr}, {"timestamp-attribute", j.tsAttr},
	} {
		if err := checkAttribute(a.flag, a.name); err != nil {
			return err
		}
	}
	if j.producerAttr != "" && j.idAttr == "" && (j.keyFrom == "" || j.keyFrom == "attribute") {
		return errors.New("--producer-attribute labels messages missing their key, so it needs --id-attribute or --key-from json:PATH")
	}
	return nil
}

// checkSink checks --sink and the flags only one kind of sink reads: a
// flag the chosen sink would ignore is refused, not dropped in silence.
func (j *job) checkSink() error {
	kind, err := sinkKind(j.sink)
	if err != nil {
		return err
	}
	switch {
	case kind == sinkPubSub && j.outTopic == "":
		return errors.New("missing output: give --output-topic (or another --sink)")
	case kind != sinkPubSub && j.outTopic != "":
		return fmt.Errorf("--output-topic applies to --sink pubsub only, not --sink %s", sinkLabel(j.sink))
	}
	if kind != sinkPostgres {
		for _, f := range []string{"table", "on-conflict"} {
			if j.given[f] {
				return fmt.Errorf("--%s applies to --sink postgres only, not --sink %s", f, sinkLabel(j.sink))
			}
		}
		return nil
	}
	if _, err := postgres.ParseOnConflict(j.onConflict); err != nil {
		return fmt.Errorf("--on-conflict: %w", err)
	}
	return nil
}

// checkState checks the form of --state and that its store can hold the
// horizon, before anything connects: a typo should not first show up as a
// Pub/Sub credentials error.
func (j *job) checkState() error {
	maxH, kind, err := store.MaxHorizon(j.state)
	if err != nil {
		return fmt.Errorf("--state: %w", err)
	}
	if j.horizon > maxH {
		return fmt.Errorf("--horizon %v is longer than the %s store holds (%v)", j.horizon, kind, maxH)
	}
	return nil
}

// checkAuditSize checks --audit-fp and --audit-capacity: the audit takes
// zero for its default, and a flag given as 0 must not become 0.001.
func (j *job) checkAuditSize() error {
	if fp := j.auditFP; !(fp > 0 && fp < 0.5) {
		return fmt.Errorf("--audit-fp %v is out of range: want a rate between 0 and 0.5, both excluded (default %v)", fp, audit.DefaultFalsePositive)
	}
	if j.auditCapacity < audit.DefaultGenerations {
		return fmt.Errorf("--audit-capacity %d is out of range: want at least %d keys, one per generation of the filter (default %d)",
			j.auditCapacity, audit.DefaultGenerations, audit.DefaultCapacity)
	}
	return nil
}

// checkResources reports an input, output or dead-letter that does not
// exist, so a typo in a flag fails at start rather than after "pipeline
// running" or as an endless "sink unreachable".
func checkResources(ctx context.Context, c *pubsub.Client, in, out, dl pubsubio.Name, fromTopic bool) error {
	if !fromTopic {
		if err := pubsubio.CheckSubscription(ctx, c, in); err != nil {
			return err
		}
	}
	topics := []pubsubio.Name{out, dl}
	if fromTopic {
		topics = append(topics, in)
	}
	for _, t := range topics {
		if t.ID != "" {
			if err := pubsubio.CheckTopic(ctx, c, t); err != nil {
				return err
			}
		}
	}
	return nil
}
