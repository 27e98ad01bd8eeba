// Package dedup is the core of dedupflow: how a message's dedup key is chosen,
// how the two kinds of duplicates are told apart, and the claim / commit /
// release protocol that makes "at most one output per key, nothing lost" hold
// when sinks fail and processes die. It does no I/O; state lives behind the
// Store interface and time comes from an injected clock.
//
// A redelivery is the same message again: Pub/Sub hands out the message ID it
// already delivered. A republish is a new message (new ID) that carries the
// same logical event, because a publisher retried; only a key the publisher
// stamps in an attribute collapses it.
package dedup
