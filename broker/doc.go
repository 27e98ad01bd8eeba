// Package broker is a fast, durable message broker that speaks the
// google.pubsub.v1 Publisher and Subscriber gRPC services, so the official
// Pub/Sub clients work against it unchanged through PUBSUB_EMULATOR_HOST.
//
// The same port serves Pub/Sub's v1 REST API (for gcloud, curl and REST
// clients): its routes come from the services' google.api.http
// annotations, its JSON is protojson, and a request runs the same
// implementation as the gRPC call (api_rest.go, internal/transcode,
// api_listen.go). Requests that a
// browser marks as cross-site, and Host names other than loopback, IP
// literals and Options.AllowedHosts, are refused, so a web page cannot
// drive it.
//
// # Where things are
//
// The API surface is in the files named api_*.go: the gRPC services
// (api_publisher.go, api_subscriber.go, api_stream.go for StreamingPull,
// api_schema.go, api_iam.go), the REST API's handler (api_rest.go) and the
// transform calls only REST has (api_transformcalls.go), the checks of
// requests' names, settings and update masks (api_names.go, api_mask.go),
// the changes of topics and subscriptions that the RPCs make and the log's
// replay makes again (api_admin.go), the console's overview
// (api_overview.go) and the port gRPC and REST share (api_listen.go).
// bootstrap.go creates the resources Options name before the broker
// serves.
//
// The engine is in the other files: the state (model.go), delivery
// (engine.go, queue.go, delivery.go, push.go, oidc.go), snapshots
// (snapshot.go), transforms (transform.go) and durability (durable.go,
// record.go, log.go, wal.go, replay.go). What needs no broker is in
// internal packages, each tested alone: logframe (the log's framing), wire
// (a message's encoding and the StreamingPull response), filter (the
// filter language), schemacheck (schema revisions), udf (JavaScript
// transforms) and transcode (REST to the gRPC services).
//
// # Delivery
//
// Every subscription keeps its backlog in a FIFO ring buffer of pointers to
// shared, immutable messages; a publish appends one pointer per attached
// subscription. Leases (delivered, unacknowledged messages) are found by ack
// ID in a per-subscription map, and their deadlines, together with retry
// backoffs, sit in one min-heap served by a single timer goroutine. Taking
// a message, acking it and expiring it are O(1) or O(log n); nothing scans
// the backlog, so delivery does not slow down as the backlog grows.
//
// A message keeps its data and attributes as the protobuf encoding of the
// PubsubMessage fields they are, made once at publish, outside the lock. A
// StreamingPull response is encoded by hand into a buffer the stream
// reuses: per message the ack ID, that encoding copied as it is, the message
// ID and the publish time; it leaves as the unknown fields of an empty
// StreamingPullResponse, which the protobuf runtime writes out verbatim.
// Building ReceivedMessage structs instead cost five allocations and a
// reflective walk of the attribute map per message, most of the broker's
// CPU per streamed message (internal/wire).
//
// Ordering keys: a subscription with message ordering keeps one queue per
// key and puts a token for the key in its FIFO when the key may deliver; a
// key hands out what it has queued as one batch and stays busy until that
// batch is resolved, which gives "one outstanding batch per key, in order".
//
// Semantics follow the service and, where it is observable, Google's
// official emulator: message IDs are decimal counters; delivery_attempt is
// set only with a dead-letter policy; a message is dead-lettered after
// max_delivery_attempts failed deliveries, republished with a new ID and the
// CloudPubSubDeadLetterSource* attributes the emulator adds; exactly-once
// subscriptions reject acks and modacks of expired ack IDs with the
// ErrorInfo metadata ("PERMANENT_FAILURE_INVALID_ACK_ID") the clients read.
// Subscription filters use the service's language (internal/filter); each is
// parsed once, when the subscription is created or loaded, and applied when
// a message is queued: a message the filter rejects is acknowledged there and
// then, so no delivery path (Pull, StreamingPull, push) sees it and it
// counts toward neither the backlog nor dead-lettering. Matching walks the
// encoded attributes and allocates nothing.
//
// Snapshots (snapshot.go) keep pointers to the shared messages: the
// subscription's unacknowledged ones when it is taken, then every message
// published to the topic, until it expires 7 days minus the age of the
// oldest message it kept, as the service documents; seeking to one queues
// exactly those messages (that the subscription's filter passes) again.
//
// Topics and subscriptions can exist before the broker serves: Ensure
// creates what ParseResources read from a YAML or JSON file of the REST
// API's Topic and Subscription resources (bootstrap.go), through the same
// handlers as a client's requests, and refuses one that exists with another
// configuration, naming the field.
//
// Schemas (api_schema.go, internal/schemacheck): the SchemaService with AVRO
// (hamba/avro) and PROTOCOL_BUFFER (.proto source compiled by protocompile,
// checked with dynamicpb) revisions, each parsed once when committed. A
// topic's schema_settings make Publish check every message against the
// revisions in range, newest first, outside the broker's lock; a message
// that matches none fails the request with one line per failing message,
// and a matching one carries the googclient_schema* attributes. Avro JSON
// is checked as strictly as Google's emulator does (every field present,
// unions wrapped), Avro binary by decoding it.
//
// IAM (api_iam.go): google.iam.v1.IAMPolicy for topics, subscriptions,
// snapshots and schemas. Policies are stored with etags, logged, and
// deleted with their resource, but not enforced: the broker knows no
// caller's identity.
//
// Not supported: ingestion sources; those calls answer Unimplemented.
// BigQuery and Cloud Storage subscriptions write to the emulators that
// Options.Exports names (export.go).
//
// # Push
//
// A subscription with a push endpoint (set at creation, by an update of
// push_config or by ModifyPushConfig; an empty config switches it back to
// pull) is delivered by a pusher of its own: a goroutine that leases what
// the push window allows and starts a worker per outstanding message, or
// per ordering key's batch on an ordered subscription, so that a key's
// messages reach the endpoint one at a time, in order (push.go); there a
// message's ack deadline runs from its own request, and after a failure
// the rest of the batch goes back unsent, its attempts not counted. The
// request is the service's: a POST of the wrapped JSON body, with the
// fields in the order the service documents them
//
//	{"deliveryAttempt":N,"message":{"attributes":{…},"data":"base64","messageId":"…","message_id":"…",
//	 "orderingKey":"…","publishTime":"…","publish_time":"…"},"subscription":"projects/…"}
//
// (deliveryAttempt only with a dead-letter policy, times in UTC with
// milliseconds), or with no_wrapper the data itself; write_metadata adds
// the x-goog-pubsub-subscription-name, -message-id, -publish-time,
// -ordering-key and -delivery-attempt headers (x-goog-pubsub-<KEY>, as the
// service documents it) and every attribute that is a valid header field
// and not one that HTTP or the metadata owns. 102, 200, 201, 202 and 204
// ack; any other status (a redirect included), a failed connection or no
// answer within the ack deadline nacks. A nacked message waits out the
// retry policy, or without one the service's push backoff (100 ms,
// doubling per attempt, up to 60 s); dead-letter policies count push
// attempts as they count pulls. The window starts at 3 outstanding
// messages, grows by one per ack (doubling per round trip, as TCP's slow
// start) and halves per failure, between 1 and the service's 3,000. A
// failing endpoint is therefore sent little, and a slow one only fills its
// own window: other subscriptions are not held back. When a subscription
// switches to pull, requests in flight finish; Shutdown cancels them and
// returns their messages without counting the attempt.
//
// With an oidc_token the request carries "Authorization: Bearer" and a JWT
// with the claims the service documents: iss "https://accounts.google.com",
// aud (the configured audience, or the endpoint URL), email and
// email_verified, sub and azp (the email: there is no numeric account ID
// here), iat and exp (an hour later). Google's keys cannot sign it here, so
// the broker signs it (RS256) with a key of its own, Options.PushKey or one
// generated on first use, named by the token's kid. A handler under test
// verifies it with the key from PushPublicKey, or fetches the key set (a
// JSON Web Key Set, the form of Google's own certificates) from the
// broker's port at /oauth2/v3/certs, the path of Google's (PushKeysPath;
// PushKeysHandler serves it elsewhere).
//
// Google's emulator, measured beside it in push_test.go, differs: it
// redelivers after a 202, leaves orderingKey and deliveryAttempt out of the
// body, writes the ordering key as X-Goog-Ordering-Key and no delivery
// attempt header, sends no token, retries a nacked push every second
// whatever the retry policy, and did not dead-letter an ordered push
// message.
//
// # Durability
//
// With Options.DataDir the broker writes an append-only log of its state
// changes (topic, subscription and snapshot configuration, publishes, acks,
// seeks) and answers a Publish only after its records are written and fsynced.
// (A subscriber may see a message a moment before it is durable; if the
// broker dies in that moment, the publisher got no answer and retries.)
// Acks are logged but not waited for, except on exactly-once
// subscriptions, where a successful ack promises no redelivery; a lost
// ack otherwise means one redelivery, which at-least-once allows.
// Fsyncs are group commits: one writer goroutine flushes everything that
// concurrent requests appended since its last write, so throughput stays
// high while every acknowledged publish is durable. A restart reads the log
// once and then serves: replay cuts a torn tail from a crash (it was never
// acknowledged) and appends after the last intact record instead of
// rewriting the file first, and compaction, which keeps the log within
// about twice the live state, runs in the background without stopping the
// broker (the state is captured under the lock as pointers to the immutable
// messages, the checkpoint is written outside it, and what was logged
// meanwhile follows it in the new file). What the log holds is one table
// (durable.go): per record kind its encoding, its replay, and what a
// checkpoint saves of it; replay and compaction both walk that table, so a
// new kind cannot be forgotten by one of them. Ack IDs count on from the start
// time, so an ack sent to the previous process cannot match a lease of this
// one.
//
// Why a log of its own rather than bbolt or Pebble: the workload is a queue
// (append, then delete almost everything soon after), the delivery state is
// held in memory anyway, and durability only needs the order of changes.
// BenchmarkStorage (storage_bench_test.go, and bbolt's side in
// bench/bboltstorage) compares the two: with group commit an ack is a
// 10-byte append, whereas every bbolt batch rewrites B+tree pages and
// fsyncs data and meta pages, and a delete costs as much as an insert. Pebble would also be a log plus compaction, but a large
// dependency for a state that already lives in memory. A Publish RPC
// carries up to 100 messages in one wait, so the end-to-end durable rate
// is far above the per-record one (BenchmarkEndToEnd); the figures are in
// BENCHMARKS.md.
//
// Memory: a queued message costs its encoded payload and attributes
// (rounded up to a Go size class) plus a fixed amount of bookkeeping (the
// message struct, one queue slot per subscription, the ring buffer's spare
// room); BenchmarkEndToEnd reports it as heap-B/queued-msg.
package broker
