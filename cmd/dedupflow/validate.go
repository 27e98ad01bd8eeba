package main

import (
	"context"
	"errors"
	"fmt"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/pubsubio"
	"github.com/dedupflow/dedupflow/sink/postgres"
)

// checkAttribute checks an attribute name given in a flag against what
// Pub/Sub accepts, so a bad name fails at start instead of on every message.
func checkAttribute(flag, name string) error {
	if name == "" {
		return nil
	}
	if err := limits.AttributeKey(name); err != nil {
		return fmt.Errorf("--%s: %w", flag, err)
	}
	return nil
}

func (j *jobFlags) checkAttributes() error {
	k := j.key
	for _, a := range []struct{ flag, name string }{
		{"id-attribute", k.idAttr}, {"output-id-attribute", k.outIDAttr},
		{"producer-attribute", k.producerAttr}, {"timestamp-attribute", j.time.tsAttr},
	} {
		if err := checkAttribute(a.flag, a.name); err != nil {
			return err
		}
	}
	if k.producerAttr != "" && k.idAttr == "" && (k.keyFrom == "" || k.keyFrom == "attribute") {
		return errors.New("--producer-attribute labels messages missing their key, so it needs --id-attribute or --key-from json:PATH")
	}
	return nil
}

// checkSink checks --sink and the flags only one kind of sink reads: a
// flag the chosen sink would ignore is refused, not dropped in silence.
func (j *jobFlags) checkSink() (sinkSpec, error) {
	s := sinkSpec{url: j.sink.spec, table: j.sink.table}
	var err error
	if s.kind, err = sinkKind(s.url); err != nil {
		return s, err
	}
	switch {
	case s.kind == sinkPubSub && j.names.outTopic == "":
		return s, errors.New("missing output: give --output-topic (or another --sink)")
	case s.kind != sinkPubSub && j.names.outTopic != "":
		return s, fmt.Errorf("--output-topic applies to --sink pubsub only, not --sink %s", sinkLabel(s.url))
	}
	if err := j.checkColumns(&s); err != nil || tableSink(s.kind) {
		return s, err
	}
	if s.kind != sinkPostgres {
		for _, f := range []string{"table", "on-conflict"} {
			if j.given[f] {
				return s, fmt.Errorf("--%s applies to --sink postgres only, not --sink %s", f, sinkLabel(s.url))
			}
		}
		return s, nil
	}
	if s.table == "" {
		s.table = postgres.DefaultTable
	}
	if s.onConflict, err = postgres.ParseOnConflict(j.sink.onConflict); err != nil {
		return s, fmt.Errorf("--on-conflict: %w", err)
	}
	return s, nil
}

// check checks --audit-fp and --audit-capacity: the audit takes zero for
// its default, and a flag given as 0 must not become 0.001.
func (a auditFlags) check() error {
	if fp := a.fp; !(fp > 0 && fp < 0.5) {
		return fmt.Errorf("--audit-fp %v is out of range: want a rate between 0 and 0.5, both excluded (default %v)", fp, audit.DefaultFalsePositive)
	}
	if a.capacity < audit.DefaultGenerations {
		return fmt.Errorf("--audit-capacity %d is out of range: want at least %d keys, one per generation of the filter (default %d)",
			a.capacity, audit.DefaultGenerations, audit.DefaultCapacity)
	}
	return nil
}

// checkResources reports an input, output or dead-letter that does not
// exist, so a typo in a flag fails at start rather than after "pipeline
// running" or as an endless "sink unreachable".
func checkResources(ctx context.Context, c *pubsub.Client, cfg *jobConfig) error {
	input := cfg.in // the topic the pipeline reads
	if !cfg.fromTopic && cfg.push.addr == "" {
		topic, err := pubsubio.CheckSubscription(ctx, c, cfg.in)
		if err != nil {
			return err
		}
		input, _ = pubsubio.TopicName("", topic)
	}
	if cfg.out.ID != "" && input == cfg.out {
		via := ""
		if !cfg.fromTopic {
			via = " (through " + cfg.in.String() + ")"
		}
		return fmt.Errorf("--output-topic %s is the topic the pipeline reads%s: it would receive its own output again and again; "+
			"give another output topic (create one: gcloud pubsub topics create %s-deduped) and point the consumers' subscriptions at it", cfg.out, via, cfg.out.ID)
	}
	topics := []pubsubio.Name{cfg.out, cfg.deadLetter}
	if cfg.fromTopic {
		topics = append(topics, cfg.in)
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
