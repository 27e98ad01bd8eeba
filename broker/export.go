package broker

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/storage"
	"google.golang.org/protobuf/proto"

	"github.com/dedupflow/dedupflow/internal/bigquery"
	"github.com/dedupflow/dedupflow/limits"
)

// Export subscriptions (BigQuery and Cloud Storage) are delivered by an
// exporter of their own, as push subscriptions are by a pusher: a goroutine
// that leases messages, gathers them into a batch, writes the batch to the
// destination and only then acknowledges them. A broker killed between
// the write and the acknowledgement writes those messages again on its next
// start (at-least-once, as the service); an acknowledged message was
// written.

// ExportOptions name the servers that export subscriptions write to. Empty
// fields leave those subscriptions holding their messages, with a state
// that says why.
type ExportOptions struct {
	// StorageHost is the Cloud Storage JSON API that Cloud Storage
	// subscriptions write objects to: host:port or a URL, as the Go storage
	// client's STORAGE_EMULATOR_HOST.
	StorageHost string
	// BigQuery is the BigQuery emulator that BigQuery subscriptions write
	// to: its REST API (tables) and its gRPC Storage API (appends).
	BigQuery bigquery.Endpoints
}

// ExportOptionsFromEnv reads ExportOptions from the variables the
// emulators' users set: STORAGE_EMULATOR_HOST, BIGQUERY_EMULATOR_HOST and
// BIGQUERY_STORAGE_EMULATOR_HOST.
func ExportOptionsFromEnv(getenv func(string) string) ExportOptions {
	return ExportOptions{StorageHost: getenv("STORAGE_EMULATOR_HOST"),
		BigQuery: bigquery.Endpoints{REST: getenv(bigquery.EnvREST), Storage: getenv(bigquery.EnvStorage)}}
}

// exportShared is what the export subscriptions of a broker share.
type exportShared struct {
	storageOnce sync.Once
	storage     *storage.Client
	storageErr  error
	exportStats map[string]*exportStats // by subscription name; b.mu
	// deliveryErrors says, for a message an export is dead-lettering, why
	// it could not be written; set only around that nack, b.mu held.
	deliveryErrors map[*message]string
	bqMu           sync.Mutex
	bqClients      map[string]*bigquery.Client // by project
}

func (b *Broker) closeExports() {
	if b.storage != nil {
		b.storage.Close()
	}
	for _, c := range b.bqClients {
		c.Close()
	}
}

// exportState is a destination's state, as both BigQueryConfig.State and
// CloudStorageConfig.State name it (their numbers differ).
type exportState int8

const (
	exportActive exportState = iota
	exportPermissionDenied
	exportNotFound
	exportSchemaMismatch
)

// exportRetry is how long an exporter waits before it checks again a
// destination that could not be written.
const exportRetry = 2 * time.Second

// errDestination is a fault of the destination, which sets the
// subscription's state: the batch is given back and written once the
// destination is fixed.
type destError struct {
	state exportState
	err   error
}

func (e *destError) Error() string { return e.err.Error() }
func (e *destError) Unwrap() error { return e.err }

// exportDest writes batches to one destination with one configuration.
type exportDest interface {
	// check reports whether the destination can be written to; a
	// *destError says why not.
	check(ctx context.Context) error
	// write writes the batch. It returns an error when nothing was
	// written, else each message's outcome (nil: all written): a
	// *rowError for a message that can never be written, which follows
	// the subscription's dead-letter policy; any other error leaves the
	// message to be written again.
	write(ctx context.Context, batch []delivery) ([]error, error)
	// limits are when a batch is written: a count, a size, an age.
	limits() (msgs, bytes int, age time.Duration)
	close()
}

// rowError is a message that does not fit its destination.
type rowError struct{ err error }

func (e *rowError) Error() string { return e.err.Error() }
func (e *rowError) Unwrap() error { return e.err }

// exportStats are what an exporter has done since the broker started, for
// the /broker page and the metrics.
type exportStats struct {
	batches  atomic.Int64 // objects written, or appends made
	messages atomic.Int64 // messages written
	bytes    atomic.Int64 // message bytes written
	failed   atomic.Int64 // messages that could not be written (dead-lettered or nacked)
	errors   atomic.Int64 // batches the destination refused or that failed
	mu       sync.Mutex
	state    exportState
	reason   string // why the state is not active
}

type exporter struct {
	b     *Broker
	s     *subscription
	wake  chan struct{}
	stats *exportStats
	// newDest makes the destination of a configuration.
	newDest func(sp *pb.Subscription) (exportDest, error)
}

func (s *subscription) exports() bool {
	return s.proto.CloudStorageConfig != nil || s.proto.BigqueryConfig != nil
}

// exportConfig is the part of the subscription that shapes its export; a
// change restarts the exporter's destination.
func exportConfig(sp *pb.Subscription) proto.Message {
	if c := sp.CloudStorageConfig; c != nil {
		c = proto.Clone(c).(*pb.CloudStorageConfig)
		c.State = 0
		return c
	}
	if c := sp.BigqueryConfig; c != nil {
		c = proto.Clone(c).(*pb.BigQueryConfig)
		c.State = 0
		return c
	}
	return nil
}

// startExporterLocked starts exporting s if it is an export subscription
// without an exporter. Exporters stop by themselves once their
// subscription is deleted or stops exporting, and with the broker.
func (b *Broker) startExporterLocked(s *subscription) {
	if b.replaying || s.exporter != nil || s.deleted() || !s.exports() {
		return
	}
	select {
	case <-b.closing:
		return
	default:
	}
	e := &exporter{b: b, s: s, wake: make(chan struct{}, 1), stats: b.exportStatsLocked(s.proto.Name), newDest: b.newExportDest}
	s.exporter = e
	s.waiters[e.wake] = struct{}{}
	b.wg.Add(1)
	go e.run()
}

func (e *exporter) activeLocked() bool {
	select {
	case <-e.b.closing:
		return false
	default:
	}
	return !e.s.deleted() && e.s.exports() && e.s.exporter == e
}

func (e *exporter) run() {
	b, s := e.b, e.s
	defer b.wg.Done()
	var (
		batch   []delivery
		size    int
		first   int64 // when the batch's first message was leased, broker clock
		cfg     proto.Message
		dest    exportDest
		blocked bool      // the destination's last check or write failed
		checked time.Time // when it was last checked, so that publishes do not hammer a failing one
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		wait := time.Duration(-1) // until woken
		b.mu.Lock()
		if !e.activeLocked() {
			e.giveBackLocked(batch)
			delete(s.waiters, e.wake)
			if s.exporter == e {
				s.exporter = nil
			}
			b.mu.Unlock()
			if dest != nil {
				dest.close()
			}
			return
		}
		if c := exportConfig(s.proto); !proto.Equal(c, cfg) {
			e.giveBackLocked(batch)
			if dest != nil {
				dest.close()
			}
			batch, size, cfg, dest = batch[:0], 0, c, nil
		}
		sp := s.proto
		b.mu.Unlock()

		if dest == nil || (blocked && time.Since(checked) >= exportRetry) {
			checked = time.Now()
			var err error
			if dest == nil {
				dest, err = e.newDest(sp)
			}
			if err == nil {
				err = dest.check(b.pushCtx)
			}
			blocked = err != nil
			e.setState(err)
		}
		if !blocked {
			maxMsgs, maxBytes, maxAge := dest.limits()
			full := false
			if room := maxMsgs - len(batch); room > 0 && size < maxBytes {
				b.mu.Lock()
				now := b.nowNanos()
				b.fireTimersLocked(now)
				deadline := time.Duration(s.proto.AckDeadlineSeconds) * time.Second
				n := len(batch)
				batch = b.deliverLocked(s, min(room, 1000), min(maxBytes-size, limits.RequestBytes), deadline, nil, batch)
				if n == 0 && len(batch) > 0 {
					first = now
				}
				// deliverLocked stops before a message that would pass the
				// byte budget: the batch is as full as it gets. The next
				// one starts with that message, which may pass max_bytes
				// alone, as the service allows.
				full = n > 0 && len(batch)-n < min(room, 1000) && s.ready.len() > 0
				ts := s.transforms
				b.mu.Unlock()
				if ts != nil && len(batch) > n {
					batch = append(batch[:n], b.transformDeliveries(s, ts, batch[n:])...)
				}
				for _, d := range batch[n:] {
					size += len(d.m.data())
				}
			}
			age := time.Duration(b.nowNanos() - first)
			switch {
			case len(batch) == 0:
			case len(batch) >= maxMsgs || size >= maxBytes || full || age >= maxAge:
				err := e.flush(dest, batch)
				e.setState(err)
				blocked = err != nil
				batch, size = batch[:0], 0
				continue
			default:
				// The broker's clock may be a test's: look again soon
				// rather than trusting a timer for the whole age.
				wait = min(maxAge-age, 100*time.Millisecond)
			}
		}
		if blocked {
			wait = exportRetry
		}
		if wait >= 0 {
			timer.Reset(wait)
		}
		select {
		case <-e.wake:
		case <-timer.C:
		case <-b.closing:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// flush writes a batch and settles its leases: written messages are
// acknowledged, those the destination refused one by one are nacked (to
// their dead-letter policy), and a batch that was not written at all is
// given back without counting the attempt.
func (e *exporter) flush(dest exportDest, batch []delivery) error {
	b, s := e.b, e.s
	b.mu.Lock()
	now := b.nowNanos()
	deadline := int64(time.Duration(s.proto.AckDeadlineSeconds) * time.Second)
	live := batch[:0]
	for _, d := range batch {
		// Messages whose lease ended (a seek, an expiry) are not written:
		// they are queued again already.
		if l := s.leases[d.ackID]; l != nil && !l.backoff {
			l.at = now + deadline // the write gets a whole ack deadline
			b.timers.fix(l)
			live = append(live, d)
		}
	}
	b.mu.Unlock()
	if len(live) == 0 {
		return nil
	}
	errs, err := dest.write(b.pushCtx, live)
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil {
		e.stats.errors.Add(1)
		e.giveBackLocked(live)
		if b.pushCtx.Err() == nil {
			b.log.Warn("export failed; its messages are kept and written again", "subscription", s.proto.Name, "messages", len(live), "err", err)
		}
		return err
	}
	now = b.nowNanos()
	for i, d := range live {
		l := s.leases[d.ackID]
		if l == nil || l.backoff {
			continue // written, but its lease ended: it may be written again
		}
		var rerr error
		if errs != nil {
			rerr = errs[i]
		}
		var unfit *rowError
		switch {
		case rerr == nil:
			e.stats.messages.Add(1)
			e.stats.bytes.Add(int64(len(d.m.data())))
			b.ackLeaseLocked(l)
		case errors.As(rerr, &unfit):
			e.stats.failed.Add(1)
			e.unfitLocked(l, rerr, now)
		default:
			e.stats.errors.Add(1)
			e.giveBackLocked([]delivery{d})
		}
	}
	e.stats.batches.Add(1)
	return nil
}

// unfitLocked handles a message its destination refused: once it has used
// up the delivery attempts of its dead-letter policy it is dead-lettered
// with the reason; until then (and for ever without a policy) it stays
// unacknowledged and is tried again when its ack deadline passes, as a
// message its subscriber did not acknowledge.
func (e *exporter) unfitLocked(l *lease, why error, now int64) {
	b, s := e.b, e.s
	b.log.Debug("export: a message does not fit its destination", "subscription", s.proto.Name,
		"message_id", l.it.m.id(), "attempt", l.it.attempts, "err", why)
	p := s.proto.DeadLetterPolicy
	if p == nil || l.it.attempts < p.MaxDeliveryAttempts {
		return
	}
	if b.deliveryErrors == nil {
		b.deliveryErrors = map[*message]string{}
	}
	b.deliveryErrors[l.it.m] = why.Error()
	b.nackLocked(l, now)
	delete(b.deliveryErrors, l.it.m)
}

// giveBackLocked ends the leases of a batch that was not written; the
// messages are queued again as they were, the attempt not counted.
func (e *exporter) giveBackLocked(batch []delivery) {
	// Each goes back to the front of its queue: the last first, so that
	// they keep their order (an ordering key's above all).
	for _, d := range slices.Backward(batch) {
		l := e.s.leases[d.ackID]
		if l == nil || l.backoff {
			continue
		}
		e.b.endLeaseLocked(l)
		l.it.attempts--
		e.b.requeueLocked(e.s, l.it)
	}
}

// setState records the outcome of a check or a write: the subscription
// shows the state, and a change is logged once.
func (e *exporter) setState(err error) {
	st, reason := exportActive, ""
	if err != nil {
		st, reason = exportNotFound, err.Error()
		var de *destError
		if errors.As(err, &de) {
			st = de.state
		}
	}
	e.stats.mu.Lock()
	changed := st != e.stats.state || reason != e.stats.reason
	e.stats.state, e.stats.reason = st, reason
	e.stats.mu.Unlock()
	b, s := e.b, e.s
	b.mu.Lock()
	name := s.proto.Name // s.proto is replaced under b.mu, by an update too
	if s.exporter == e && exportStateOf(s.proto) != st {
		// An update resets the shown state to ACTIVE, so it is compared
		// with the proto, not with the last one set. The proto is shared
		// with lists being answered: replace it.
		sp := proto.Clone(s.proto).(*pb.Subscription)
		setExportState(sp, st)
		s.proto = sp
	}
	b.mu.Unlock()
	if !changed {
		return
	}
	if err != nil {
		b.log.Warn("export subscription cannot write; it keeps its messages until it can", "subscription", name, "state", stateName(st), "err", err)
	} else {
		b.log.Info("export subscription writes", "subscription", name)
	}
}

// The states of each kind of export, by exportState.
var (
	storageStates = map[exportState]pb.CloudStorageConfig_State{
		exportActive: pb.CloudStorageConfig_ACTIVE, exportPermissionDenied: pb.CloudStorageConfig_PERMISSION_DENIED,
		exportNotFound: pb.CloudStorageConfig_NOT_FOUND, exportSchemaMismatch: pb.CloudStorageConfig_SCHEMA_MISMATCH,
	}
	bigQueryStates = map[exportState]pb.BigQueryConfig_State{
		exportActive: pb.BigQueryConfig_ACTIVE, exportPermissionDenied: pb.BigQueryConfig_PERMISSION_DENIED,
		exportNotFound: pb.BigQueryConfig_NOT_FOUND, exportSchemaMismatch: pb.BigQueryConfig_SCHEMA_MISMATCH,
	}
)

// exportStateOf is the state the subscription shows, or -1.
func exportStateOf(sp *pb.Subscription) exportState {
	for st := range storageStates {
		if c := sp.CloudStorageConfig; c != nil && c.State == storageStates[st] {
			return st
		}
		if c := sp.BigqueryConfig; c != nil && c.State == bigQueryStates[st] {
			return st
		}
	}
	return -1
}

func setExportState(sp *pb.Subscription, st exportState) {
	if c := sp.CloudStorageConfig; c != nil {
		c.State = storageStates[st]
	}
	if c := sp.BigqueryConfig; c != nil {
		c.State = bigQueryStates[st]
	}
}

func stateName(st exportState) string {
	return [...]string{"ACTIVE", "PERMISSION_DENIED", "NOT_FOUND", "SCHEMA_MISMATCH"}[st]
}

// exportStatsLocked returns the stats of the named subscription, kept
// across its exporter's restarts (a config change) for the page and the
// metrics.
func (b *Broker) exportStatsLocked(name string) *exportStats {
	if b.exportStats == nil {
		b.exportStats = map[string]*exportStats{}
	}
	st := b.exportStats[name]
	if st == nil {
		st = &exportStats{}
		b.exportStats[name] = st
	}
	return st
}

// ExportStats describe an export subscription: where it writes, its state
// and what it wrote since the broker started.
type ExportStats struct {
	Kind        string // "bigquery" or "cloud_storage", as Cloud Monitoring's delivery_type
	Destination string // the table (project.dataset.table) or gs://bucket
	State       string // the config's state: ACTIVE, NOT_FOUND, ...
	Reason      string // why the state is not ACTIVE
	// Batches counts objects written (Cloud Storage) or appends made
	// (BigQuery); Messages and Bytes what they held.
	Batches, Messages, Bytes int64
	// Failed counts messages the destination refused (they stay
	// unacknowledged or are dead-lettered); Errors writes that failed as
	// a whole and were retried.
	Failed, Errors int64
}

func (s *subscription) exportStatsLocked() *ExportStats {
	e := s.exporter
	if e == nil || !s.exports() {
		return nil
	}
	st := &ExportStats{Kind: "cloud_storage", Destination: "gs://" + s.proto.CloudStorageConfig.GetBucket(),
		Batches: e.stats.batches.Load(), Messages: e.stats.messages.Load(), Bytes: e.stats.bytes.Load(),
		Failed: e.stats.failed.Load(), Errors: e.stats.errors.Load()}
	if c := s.proto.BigqueryConfig; c != nil {
		st.Kind, st.Destination = "bigquery", c.Table
	}
	e.stats.mu.Lock()
	st.State, st.Reason = stateName(e.stats.state), e.stats.reason
	e.stats.mu.Unlock()
	return st
}

// newExportDest makes the destination of an export subscription.
func (b *Broker) newExportDest(sp *pb.Subscription) (exportDest, error) {
	if c := sp.CloudStorageConfig; c != nil {
		return b.newStorageDest(sp.Name, c)
	}
	return b.newBigQueryDest(sp.Name, sp.BigqueryConfig)
}
