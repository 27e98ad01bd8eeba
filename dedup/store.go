package dedup

import (
	"context"
	"errors"
	"time"
)

// Status is what a claim found.
type Status uint8

const (
	// Proceed: the key is free (or was abandoned); the caller holds it now and
	// must Commit after the sink confirmed the write, or Release.
	Proceed Status = iota + 1
	// Duplicate: the key was committed within the horizon; ack and drop.
	Duplicate
	// InFlight: another message with this key is being written right now;
	// nack so it comes back, never drop it.
	InFlight
)

func (s Status) String() string {
	switch s {
	case Proceed:
		return "proceed"
	case Duplicate:
		return "duplicate"
	case InFlight:
		return "in_flight"
	}
	return "unknown"
}

// Kind tells the two kinds of duplicates apart.
type Kind uint8

const (
	// Redelivery: the same message ID as the one that committed the key.
	Redelivery Kind = iota + 1
	// Republish: a different message carrying the same key.
	Republish
)

func (k Kind) String() string {
	switch k {
	case Redelivery:
		return "redelivery"
	case Republish:
		return "republish"
	}
	return "none"
}

// Claim asks a store for the right to write one message.
type Claim struct {
	Key   Key
	MsgID string
	Now   time.Time
	// LeaseUntil bounds how long this claim keeps other messages with the
	// same key away; a claimant that dies is taken over after it.
	LeaseUntil time.Time
	// Extend, when set (the sliding horizon), makes a Duplicate verdict
	// also move the committed key's expiry to Extend if that is later: a
	// caught copy keeps its key for another horizon.
	Extend time.Time
}

// Verdict is a store's answer to a Claim.
type Verdict struct {
	Status Status
	Kind   Kind // set when Status is Duplicate
	// Waited is how long, on the Deduper's clock, the claim waited for
	// this process's own write of the key (Options.LocalWait) before it
	// asked the store; stores leave it zero. Latency metrics subtract it,
	// so a store's latency is not blamed for a sink write.
	Waited time.Duration
	// Expires is, for a Duplicate, when the committed key expires (before
	// any Extend); a store that cannot tell leaves it zero.
	Expires time.Time
	// Age is, for a Duplicate whose store set Expires, how long after the
	// key's first sight this copy came (with a sliding horizon: after the
	// latest caught copy), on the horizon's clock. The Deduper sets it.
	Age time.Duration
	// Retaken is, for a Proceed, that the key was taken over from a claim
	// whose lease ran out before it committed or released: that write may
	// have landed. Stores tell it only while they still hold the record.
	Retaken bool
}

// Record is a store's record of a key, as Judge reads it; the zero Record
// is an absent key.
type Record struct {
	// Until is when the record ends, in the store's own unit of time: the
	// expiry of a committed key, the end of a pending claim's lease.
	Until int64
	// Pending: the key is claimed, not committed.
	Pending bool
	// Tag is the MsgTag of the message that committed the key.
	Tag uint32
}

// Judge is the claim verdict of the Store contract, the one every Go store
// gives: for a claim at now (in r.Until's unit) by the message whose MsgTag
// is tag, a record that ended (or is absent) is Proceed, a live claim
// InFlight, a live commit a Duplicate, a redelivery when tag is the
// committer's. On Proceed the store then holds the key for the claimant.
func Judge(r Record, now int64, tag uint32) Verdict {
	switch {
	case now >= r.Until:
		return Verdict{Status: Proceed, Retaken: r.Pending}
	case r.Pending:
		return Verdict{Status: InFlight}
	case r.Tag == tag:
		return Verdict{Status: Duplicate, Kind: Redelivery}
	}
	return Verdict{Status: Duplicate, Kind: Republish}
}

// Store keeps the dedup horizon. Each method is atomic per key. Times are
// passed in rather than read from a clock so every store agrees with the
// injected one.
//
// Claim (the verdict is Judge's): committed and live → Duplicate; absent or expired → Proceed
// (pending, leased to MsgID); pending with a live lease → InFlight, even
// for the same MsgID; pending with an expired lease → Proceed (taken over).
//
// The same message ID is not let through a live lease: with replicas, a
// message whose ack deadline passed (or a seek) is handed to another
// replica while the first is still writing it, and letting it proceed
// writes it twice. A claimant that died is taken over when its lease ends.
//
// Commit records the key as done until expires, whoever holds the lease (a
// pending claim of another message is dropped): the sink already has the
// write, so later copies are duplicates.
//
// Release drops a pending claim held by msgID, so the message can be retried.
type Store interface {
	Claim(ctx context.Context, c Claim) (Verdict, error)
	Commit(ctx context.Context, k Key, msgID string, expires time.Time) error
	Release(ctx context.Context, k Key, msgID string) error
}

// ErrUnavailable marks store errors that are worth retrying later (the
// server is down or slow); callers nack and back off instead of dropping.
var ErrUnavailable = errors.New("dedup store unavailable")

// ErrFatal marks errors that retrying cannot fix: the server refused the
// credentials (WRONGPASS, NOPERM), the database or table is gone. A front
// end that meets one nacks what it holds, reports not ready, and stops
// with the error, so the process exits non-zero and whoever runs it
// (Kubernetes, systemd) sees why instead of a replica that retries forever.
var ErrFatal = errors.New("unrecoverable error")

// ErrPermanent marks the error of one message's work that retrying cannot
// fix: a sink refuses the message (too large for the output, say) or a
// handler finds it malformed. The message goes to the dead-letter topic
// (OnReject in the consumer) instead of coming back forever, and the
// others go on. sink.ErrPermanent and consumer.ErrPermanent are this value.
var ErrPermanent = errors.New("retrying cannot help")
