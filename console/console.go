// Package console is the web console of `dedupflow up`: the tutorial's
// publish form (a message and a key), ways to act out both kinds of
// duplicate, and a live view of what reached the output topic next to the
// pipeline's counters.
//
// Everything runs through Pub/Sub, as in the tutorial: the form publishes to
// the input topic, the console reads the output through a subscription of
// its own, and a redelivery is a real one — a Seek of the pipeline's
// subscription, after which Pub/Sub hands the pipeline the same message IDs
// again.
package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// DefaultEventTimeAttribute is stamped on what the console publishes.
const DefaultEventTimeAttribute = "event_time"

// Options configure a Console.
type Options struct {
	// Client reaches the Pub/Sub server (the broker of `dedupflow up`).
	Client *pubsub.Client
	// InputTopic is where the form publishes (topicToDataflow).
	InputTopic pubsubio.Name
	// PipelineSubscription is the pipeline's input subscription. It must
	// retain acknowledged messages: redelivery seeks it back in time.
	PipelineSubscription pubsubio.Name
	// OutputTopic is shown on the page; OutputSubscription is the
	// console's own subscription to it, which the live view reads.
	OutputTopic        pubsubio.Name
	OutputSubscription pubsubio.Name
	// Destination, when set, is where the pipeline writes instead of
	// OutputTopic (a table): the page names it, and says why its live
	// view stays empty.
	Destination string
	// IDAttribute is the pipeline's id attribute: the form's key goes there.
	// Empty means publisher.DefaultIDAttribute, the one dedupflow publish
	// stamps.
	IDAttribute string
	// EventTimeAttribute carries the event time (ms since the epoch); the
	// console stamps it once per submission, so copies share it as a
	// publisher's retries do. Empty means DefaultEventTimeAttribute.
	EventTimeAttribute string
	// Horizon is the pipeline's dedup horizon, shown on the page.
	Horizon time.Duration
	// Counts reads the pipeline's counters; nil or a zero result shows
	// zeros (the pipeline may not have started yet).
	Counts func() pipeline.Counts
	// Advice, if set, is the pipeline's horizon advice, shown under the
	// counts.
	Advice func() string
	Logger *slog.Logger
	Now    func() time.Time // nil: time.Now
	// AllowedHosts are host names, besides localhost and IP literals, that
	// the console answers to; any other Host header is refused, which stops
	// DNS-rebinding pages from reaching a console bound to loopback.
	AllowedHosts []string
	// BrokerPage, when set, is served at /broker and linked from the
	// page: the embedded broker's own view (package brokerpage).
	BrokerPage http.Handler
}

// Console serves the web console. It serves once: Serve releases what New
// acquired.
type Console struct {
	o        Options
	log      *slog.Logger
	now      func() time.Time
	token    string // CSRF token, embedded in the page
	instance string // tells this run's live-view event IDs from a previous run's
	pub      *pubsub.Publisher
	feed     *feed
	subs     *submissions
	handler  http.Handler
	// closing ends the live-view streams when Serve stops, even for a
	// handler mounted on someone else's server.
	closing   chan struct{}
	closeOnce sync.Once
}

const (
	maxRows        = 200  // rows the live view keeps for new and reconnecting pages
	maxSubmissions = 1000 // submissions remembered for redelivery
)

// New checks o and returns a Console.
func New(o Options) (*Console, error) {
	if o.Client == nil {
		return nil, errors.New("console: no Pub/Sub client")
	}
	for what, n := range map[string]pubsubio.Name{
		"input topic": o.InputTopic, "pipeline subscription": o.PipelineSubscription,
		"output topic": o.OutputTopic, "output subscription": o.OutputSubscription,
	} {
		if n.ID == "" || n.Project == "" {
			return nil, fmt.Errorf("console: no %s", what)
		}
	}
	if o.IDAttribute == "" {
		o.IDAttribute = publisher.DefaultIDAttribute
	}
	if o.EventTimeAttribute == "" {
		o.EventTimeAttribute = DefaultEventTimeAttribute
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Counts == nil {
		o.Counts = func() pipeline.Counts { return pipeline.Counts{} }
	}
	var b [40]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("console: make CSRF token: %w", err)
	}
	c := &Console{
		o: o, log: o.Logger, now: o.Now, token: hex.EncodeToString(b[:32]), instance: hex.EncodeToString(b[32:]),
		feed: newFeed(maxRows), subs: newSubmissions(maxSubmissions),
		closing: make(chan struct{}),
	}
	c.pub = o.Client.Publisher(o.InputTopic.String())
	// A form submission is one message (and its copies): send it now
	// rather than wait to fill a batch.
	c.pub.PublishSettings.DelayThreshold = time.Millisecond
	h, err := c.routes()
	if err != nil {
		c.pub.Stop()
		return nil, err
	}
	c.handler = h
	return c, nil
}

// Handler is the console's HTTP handler.
func (c *Console) Handler() http.Handler { return c.handler }

// Serve serves the console on ln and reads the output subscription into the
// live view until ctx is done or either fails. It returns once the HTTP
// server, the live-view streams and the subscriber have stopped.
func (c *Console) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := &http.Server{
		Handler:           c.handler,
		ReadHeaderTimeout: 5 * time.Second,
		ErrorLog:          slog.NewLogLogger(c.log.Handler(), slog.LevelWarn),
		// Request contexts end with ctx, so open live-view streams end
		// on shutdown instead of holding Shutdown until its timeout.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
		cancel()
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := c.readOutput(ctx); err != nil {
			fail(err)
		}
	}()
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fail(fmt.Errorf("console: serve: %w", err))
		}
	}()
	<-ctx.Done()
	c.closeOnce.Do(func() { close(c.closing) })
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		c.log.Warn("console: shutdown", "err", err)
	}
	wg.Wait()
	c.pub.Stop()
	return firstErr
}

// readOutput adds every message of the output subscription to the live view.
func (c *Console) readOutput(ctx context.Context) error {
	sub := c.o.Client.Subscriber(c.o.OutputSubscription.String())
	sub.ReceiveSettings.NumGoroutines = 1
	err := sub.Receive(ctx, func(ctx context.Context, m *pubsub.Message) {
		r := c.feed.add(c.rowOf(ctx, m))
		m.Ack()
		c.log.Debug("console: output", "seq", r.Seq, "message_id", m.ID, "key", r.Key)
	})
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("console: read %s: %w", c.o.OutputSubscription, err)
	}
	return nil
}

func (c *Console) rowOf(ctx context.Context, m *pubsub.Message) Row {
	r := Row{Key: m.Attributes[c.o.IDAttribute], MessageID: m.ID}
	r.KeyFromID = strings.HasPrefix(r.Key, dedup.MessageIDPrefix)
	if utf8.Valid(m.Data) {
		r.Data = string(m.Data)
	} else {
		r.Data, r.Binary = fmt.Sprintf("(%d bytes, not UTF-8)", len(m.Data)), true
	}
	et, err := dedup.ParseTimestamp(m.Attributes[c.o.EventTimeAttribute])
	if err == nil {
		r.EventTimeFrom = "attribute"
		if s := c.subs.lookup(ctx, r.Key, et); s != nil {
			r.Submission = s.id
		}
	} else {
		et, r.EventTimeFrom = m.PublishTime, "publish time"
	}
	r.EventTime = et.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	return r
}
