package dedup

import (
	"errors"
	"fmt"
	"time"

	"github.com/dedupflow/dedupflow/limits"
)

// Policy is how messages are deduped, whichever front end reads them: the
// key, the event time, the horizon and the claim lease. The pipeline's
// Config, the consumer's Options and the gate's Config embed it, and the
// gate makes its Deduper from it (Options embeds it too; the Deduper reads
// the horizon, its mode, the time domain, the lateness and the lease).
// Validate is the one place that checks it and fills its defaults.
type Policy struct {
	// IDAttribute names the attribute in which publishers stamp a stable
	// key, once, before the first attempt; empty means the message ID,
	// which catches redeliveries only. Used only when From is
	// KeyFromAttribute.
	IDAttribute string
	// Missing is what a message without the key gets: Fallback (default)
	// keys it by its message ID, Reject moves it aside, Pass lets it
	// through without dedup.
	Missing Missing
	// From says where the key is: an attribute (the default), a field of a
	// JSON payload (at Path), or a hash of the payload. See Derive.
	From KeyFrom
	// Path is the gjson path of the key field, for KeyFromJSON.
	Path string
	// TimestampAttribute holds each message's event time (milliseconds
	// since the epoch or RFC 3339); empty means the publish time. A
	// message whose attribute is missing or malformed is moved aside.
	TimestampAttribute string
	// ProducerAttribute labels the count of messages without a key, so the
	// one producer in a fleet that forgets it can be found, and every
	// outcome (dedupflow_producer_messages_total).
	ProducerAttribute string

	// Horizon is how long a written key is remembered, from first sight
	// (default DefaultHorizon, at least MinHorizon). A copy that arrives
	// later passes: the horizon protects against near-term republishing;
	// it is not an idempotency store.
	Horizon time.Duration
	// HorizonMode is Fixed (default: a key lives Horizon from first sight)
	// or Sliding (each caught copy keeps its key another Horizon).
	HorizonMode HorizonMode
	// TimeDomain is the horizon's clock: ProcessingTime (default) or
	// EventTime (see there).
	TimeDomain TimeDomain
	// AllowedLateness is how far, in event time, the watermark trails the
	// highest event time seen: keys live that much longer, and events that
	// much out of order are still judged.
	AllowedLateness time.Duration
	// Late is what happens, in event time, to a message too late to judge:
	// LatePass (default) or LateDeadLetter.
	Late Late
	// Lease is how long a claimed key keeps other copies away while its
	// message is worked on (default DefaultLease); a claimant that died is
	// taken over after it. It must outlast the work.
	Lease time.Duration
}

// Validate checks the policy and fills its defaults.
func (p *Policy) Validate() error {
	for _, a := range []struct{ name, v string }{
		{"IDAttribute", p.IDAttribute}, {"ProducerAttribute", p.ProducerAttribute}, {"TimestampAttribute", p.TimestampAttribute},
	} {
		if a.v == "" {
			continue
		}
		if err := limits.AttributeKey(a.v); err != nil {
			return fmt.Errorf("%s: %w", a.name, err)
		}
	}
	switch p.From {
	case KeyFromAttribute:
		if p.Path != "" {
			return fmt.Errorf("path %q needs From dedup.KeyFromJSON", p.Path)
		}
	case KeyFromJSON:
		if p.Path == "" {
			return errors.New("dedup.KeyFromJSON needs a Path (a gjson path such as order.id)")
		}
	case KeyFromHash:
	default:
		return fmt.Errorf("unknown From %d", p.From)
	}
	if p.Missing > Pass {
		return fmt.Errorf("unknown Missing policy %d: want dedup.Fallback, dedup.Reject or dedup.Pass", p.Missing)
	}
	if p.IDAttribute == "" && p.From == KeyFromAttribute {
		// Both settings only mean something when a message can lack the
		// id attribute; accepting them silently would hide a typo'd config.
		if p.Missing != Fallback {
			return fmt.Errorf("Missing %s needs an IDAttribute: without one every message is keyed by its message ID", p.Missing)
		}
		if p.ProducerAttribute != "" {
			return fmt.Errorf("ProducerAttribute %q needs an IDAttribute: it labels messages that lack it", p.ProducerAttribute)
		}
	}
	if p.Horizon == 0 {
		p.Horizon = DefaultHorizon
	}
	if p.Horizon < MinHorizon {
		return fmt.Errorf("horizon %v is below the minimum of %v", p.Horizon, MinHorizon)
	}
	if p.HorizonMode > Sliding {
		return fmt.Errorf("unknown HorizonMode %d", p.HorizonMode)
	}
	if p.TimeDomain > EventTime {
		return fmt.Errorf("unknown TimeDomain %d", p.TimeDomain)
	}
	if p.AllowedLateness < 0 {
		return fmt.Errorf("allowed lateness %v must not be negative", p.AllowedLateness)
	}
	if p.Late > LateDeadLetter {
		return fmt.Errorf("unknown Late policy %d", p.Late)
	}
	if p.Lease == 0 {
		p.Lease = DefaultLease
	}
	if p.Lease < 0 {
		return fmt.Errorf("lease %v must be positive", p.Lease)
	}
	return nil
}
