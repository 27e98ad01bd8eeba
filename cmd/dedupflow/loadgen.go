package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"

	"github.com/dedupflow/dedupflow/internal/backoff"
	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/publisher"
)

// Attributes loadgen sets on every message, so a consumer or a test can
// tell the messages apart without parsing payloads.
const (
	// attrSeq is the logical event's number in the run, 0-based; all
	// copies of an event share it.
	attrSeq = "dedupflow_seq"
	// attrCopy is 0 on an event's first message and 1, 2, ... on its
	// republished copies.
	attrCopy = "dedupflow_copy"
	// attrRedeliver marks an event's first message as one a test consumer
	// should have redelivered (leave unacked or nack its first delivery),
	// so the same message ID comes back: the redelivery duplicate, which
	// only the consumer side can produce. loadgen only marks.
	attrRedeliver = "dedupflow_redeliver"
)

func runLoadgen(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		project, topicName, idAttr, tsAttr, progressMode string
		cfg                                              loadPlanConfig
		rate                                             float64
		payloadSize, maxInFlight                         int
		asJSON                                           bool
		lf                                               logFlags
	)
	fs := newFlags("loadgen", stderr)
	defer func() { err = envNamed(fs, err) }()
	fs.StringVar(&project, "project", "", "Google Cloud project of a short topic ID")
	fs.StringVar(&topicName, "topic", "", "topic to publish to (ID or projects/P/topics/T)")
	fs.IntVar(&cfg.count, "count", 0, "logical events to publish")
	fs.Float64Var(&rate, "rate", 0, "logical events per second (0: as fast as the topic takes them)")
	fs.Float64Var(&cfg.dupRatio, "dup-ratio", 0.3, "share of keyed events republished as extra copies (same key, new message)")
	fs.IntVar(&cfg.dupCopies, "dup-copies", 1, "extra copies of each republished event")
	fs.Float64Var(&cfg.redeliverRatio, "redeliver-ratio", 0.05, "share of events marked "+attrRedeliver+"=1 for a test consumer to redeliver")
	fs.Float64Var(&cfg.missingRatio, "missing-id-ratio", 0, "share of events published without the id attribute")
	fs.IntVar(&payloadSize, "payload-size", 100, "bytes of data per message")
	resolveID := idAttributeVar(fs, &idAttr, "attribute holding each event's key: the pipeline's and up's --id-attribute")
	fs.StringVar(&tsAttr, "timestamp-attribute", "", "attribute to stamp the event time into, in ms since the epoch (empty: none)")
	fs.Uint64Var(&cfg.seed, "seed", 0, "seed of the plan: which events are republished, keyless, marked (0: random, printed)")
	fs.IntVar(&maxInFlight, "max-in-flight", 1000, "messages published and not yet acknowledged, at most")
	fs.BoolVar(&asJSON, "json", false, "print the summary as one JSON object")
	fs.StringVar(&progressMode, "progress", "auto", "progress on stderr: bar, lines, off, or auto (a bar on a terminal, else lines)")
	lf.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, `usage: dedupflow loadgen --topic T --count N [flags]

Publishes N logical events. Each carries a key (a UUIDv7 in --id-attribute)
unless chosen as keyless; a share of the keyed ones is republished as extra
copies (the same key on new messages), as a retrying producer does.

Every message carries %s (the event's number) and
%s (0 on the first message, 1.. on copies). The first messages
chosen by --redeliver-ratio carry %s=1: a test consumer
nacks their first delivery so the same message ID comes back, a redelivery
(loadgen only marks them).

The summary goes to stdout; a correct dedup pipeline emits as many messages
as its "expected unique keys".

`, attrSeq, attrCopy, attrRedeliver)
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	log, err := lf.logger(stderr)
	if err != nil {
		return err
	}
	if err := resolveID(log); err != nil {
		return err
	}
	switch {
	case topicName == "":
		return errors.New("missing --topic")
	case !given(fs)["count"]:
		return errors.New("missing --count N: how many logical events to publish")
	case rate < 0 || math.IsNaN(rate) || math.IsInf(rate, 0):
		return fmt.Errorf("--rate %v must be a non-negative number", rate)
	case payloadSize < 0 || payloadSize > maxPayload:
		return fmt.Errorf("--payload-size %d must be between 0 and %d bytes", payloadSize, maxPayload)
	case maxInFlight < 1:
		return fmt.Errorf("--max-in-flight %d must be at least 1", maxInFlight)
	case idAttr == "":
		return errors.New("--id-attribute must not be empty")
	}
	if cfg.seed == 0 {
		for cfg.seed == 0 {
			cfg.seed = rand.Uint64()
		}
	}
	plan, err := newLoadPlan(cfg)
	if err != nil {
		return err
	}
	p, pub, closePub, err := openPublisher(ctx, project, topicName,
		publisher.Options{IDAttribute: idAttr, TimestampAttribute: tsAttr, Logger: log})
	if err != nil {
		return err
	}
	defer closePub()
	prog, err := newProgress(progressMode, stderr, plan.totals.Messages, 2*time.Second)
	if err != nil {
		return err
	}
	g := &loadgen{p: p, raw: pub, plan: plan, tsAttr: tsAttr, payloadSize: payloadSize,
		rate: rate, maxInFlight: maxInFlight, progress: prog, log: log}
	start := time.Now()
	runErr := g.run(ctx)
	prog.finish(runErr == nil)
	s := g.summary(pub.String(), idAttr, cfg.seed, time.Since(start), runErr == nil)
	if err := s.write(stdout, asJSON); err != nil {
		return errors.Join(runErr, err)
	}
	return runErr
}

// maxPayload leaves room under the message limit for loadgen's attributes.
const maxPayload = limits.MessageBytes - 4096

// loadgen publishes a plan: each event's messages are handed to the
// client at once (it batches them), and up to maxInFlight unacknowledged
// messages are waited on by a few waiters, which also run the publisher's
// retries.
type loadgen struct {
	p           *publisher.Publisher
	raw         *pubsub.Publisher // for keyless events, which the key-stamping publisher cannot send
	plan        *loadPlan
	tsAttr      string
	payloadSize int
	rate        float64
	maxInFlight int
	progress    progress
	log         *slog.Logger

	// What the server acknowledged.
	events, messages, copies, republished, keyless, redeliver atomic.Int64
	seen                                                      sync.Map // event seq -> true, once one of its messages is stored
	// unknown counts messages whose outcome never came: the drain after a
	// stop ran out first.
	unknown atomic.Int64
}

type inFlight struct {
	res interface {
		Get(context.Context) (string, error)
	}
	ev   plannedEvent
	copy int
}

const loadgenWaiters = 16

// loadgenDrain bounds the wait, after a stop, for the outcome of the
// messages already handed to the client: it still sends them, so they
// count in the summary only once the server has answered.
const loadgenDrain = 10 * time.Second

func (g *loadgen) run(ctx context.Context) error {
	pctx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	wctx, stopWaiting := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWaiting()
	var (
		mu    sync.Mutex
		drain *time.Timer
		first error // the first publish that failed for good
	)
	unhook := context.AfterFunc(pctx, func() {
		mu.Lock()
		defer mu.Unlock()
		drain = time.AfterFunc(loadgenDrain, stopWaiting)
	})
	defer func() {
		unhook()
		mu.Lock()
		defer mu.Unlock()
		if drain != nil {
			drain.Stop()
		}
	}()
	queue := make(chan inFlight, g.maxInFlight)
	var wg sync.WaitGroup
	for range min(loadgenWaiters, g.maxInFlight) {
		wg.Go(func() {
			// Every message handed to the client is waited for, even
			// after a stop or a failure, until the drain ends.
			for f := range queue {
				_, err := f.res.Get(wctx)
				switch {
				case err == nil:
					g.acked(f)
				case wctx.Err() != nil:
					g.unknown.Add(1)
				default:
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("event %d, copy %d: %w", f.ev.seq, f.copy, err)
					}
					mu.Unlock()
					stopProducing()
				}
			}
		})
	}
	err := g.produce(pctx, queue)
	close(queue)
	wg.Wait()
	if first != nil {
		return first
	}
	return err
}

// produce publishes every planned event at the configured rate, until
// ctx ends. Each message handed to the client goes to the queue, whose
// waiters drain it to the end.
func (g *loadgen) produce(ctx context.Context, queue chan<- inFlight) error {
	start := time.Now()
	for i := 0; ; i++ {
		ev, ok := g.plan.next()
		if !ok {
			return nil
		}
		if g.rate > 0 {
			due := start.Add(time.Duration(float64(i) / g.rate * float64(time.Second)))
			if err := backoff.Sleep(ctx, time.Until(due)); err != nil {
				return err
			}
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		data := loadPayload(ev.seq, g.payloadSize)
		now := time.Now()
		attrs := func(cp int) map[string]string {
			a := map[string]string{attrSeq: strconv.Itoa(ev.seq), attrCopy: strconv.Itoa(cp)}
			if ev.redeliver && cp == 0 {
				a[attrRedeliver] = "1"
			}
			return a
		}
		if ev.keyless {
			a := attrs(0)
			if g.tsAttr != "" {
				a[g.tsAttr] = strconv.FormatInt(now.UnixMilli(), 10)
			}
			queue <- inFlight{res: g.raw.Publish(ctx, &pubsub.Message{Data: data, Attributes: a}), ev: ev}
			continue
		}
		// The copies reuse the key the first publish fixed, and its event
		// time: they are the same event, published again.
		r := g.p.Publish(ctx, publisher.Event{Data: data, Attributes: attrs(0), Time: now})
		if r.Key() == "" {
			_, err := r.Get(ctx)
			return fmt.Errorf("event %d: %w", ev.seq, err)
		}
		queue <- inFlight{res: r, ev: ev}
		// An event's copies all go out or none: a stop between them would
		// leave a republished event with fewer copies than planned.
		for c := 1; c <= ev.copies; c++ {
			queue <- inFlight{res: g.p.Publish(ctx, publisher.Event{Key: r.Key(), Data: data, Attributes: attrs(c), Time: now}), ev: ev, copy: c}
		}
	}
}

// acked counts a message the server stored. An event counts once, with
// whichever of its messages is stored first: after a stop, a copy may be
// stored while the first message's answer was lost, and its key is still
// one a pipeline emits.
func (g *loadgen) acked(f inFlight) {
	g.messages.Add(1)
	if f.copy > 0 {
		g.copies.Add(1)
	} else if f.ev.redeliver {
		g.redeliver.Add(1)
	}
	if _, seen := g.seen.LoadOrStore(f.ev.seq, true); !seen {
		g.events.Add(1)
		if f.ev.keyless {
			g.keyless.Add(1)
		}
		if f.ev.copies > 0 {
			g.republished.Add(1)
		}
	}
	g.progress.add(1)
}

// loadPayload is size bytes of readable text that starts by naming the
// event, so a payload seen in a consumer's output can be traced back.
func loadPayload(seq, size int) []byte {
	b := make([]byte, size)
	n := copy(b, "loadgen event "+strconv.Itoa(seq)+" ")
	for i := n; i < size; i++ {
		b[i] = 'a' + byte(i%26)
	}
	return b
}

// loadSummary is what a run sent. With --missing-id fallback, a correct
// dedup pipeline emits ExpectedUniqueKeys messages: one per event, keyed
// ones by their key and keyless ones by their message ID.
type loadSummary struct {
	Topic              string  `json:"topic"`
	IDAttribute        string  `json:"id_attribute"`
	Seed               uint64  `json:"seed"`
	Complete           bool    `json:"complete"`
	Events             int64   `json:"events"`
	Messages           int64   `json:"messages"`
	Copies             int64   `json:"copies"`
	RepublishedEvents  int64   `json:"republished_events"`
	KeyedEvents        int64   `json:"keyed_events"`
	KeylessEvents      int64   `json:"keyless_events"`
	RedeliverMarked    int64   `json:"redeliver_marked"`
	ExpectedUniqueKeys int64   `json:"expected_unique_keys"`
	OutcomeUnknown     int64   `json:"outcome_unknown"`
	ElapsedSeconds     float64 `json:"elapsed_seconds"`
	MessagesPerSecond  float64 `json:"messages_per_second"`
	EventsPerSecond    float64 `json:"events_per_second"`
}

func (g *loadgen) summary(topic, idAttr string, seed uint64, elapsed time.Duration, complete bool) loadSummary {
	s := loadSummary{Topic: topic, IDAttribute: idAttr, Seed: seed, Complete: complete,
		Events: g.events.Load(), Messages: g.messages.Load(), Copies: g.copies.Load(),
		RepublishedEvents: g.republished.Load(), KeylessEvents: g.keyless.Load(),
		RedeliverMarked: g.redeliver.Load(), OutcomeUnknown: g.unknown.Load(), ElapsedSeconds: elapsed.Seconds()}
	s.KeyedEvents = s.Events - s.KeylessEvents
	s.ExpectedUniqueKeys = s.Events
	if secs := elapsed.Seconds(); secs > 0 {
		s.MessagesPerSecond = float64(s.Messages) / secs
		s.EventsPerSecond = float64(s.Events) / secs
	}
	return s
}

func (s loadSummary) write(w io.Writer, asJSON bool) error {
	if asJSON {
		if err := json.NewEncoder(w).Encode(s); err != nil {
			return fmt.Errorf("write summary: %w", err)
		}
		return nil
	}
	state := ""
	if !s.Complete {
		state = " (incomplete: counts are what the server acknowledged)"
	}
	unknown := ""
	if s.OutcomeUnknown > 0 {
		unknown = fmt.Sprintf("\n  outcome unknown       %d messages (no answer from the server within %v of the stop: up to that many more may be stored)", s.OutcomeUnknown, loadgenDrain)
	}
	_, err := fmt.Fprintf(w, `loadgen summary%s
  topic                 %s
  logical events        %d
  messages sent         %d (one per event + %d republished copies of %d events)
  events without key    %d (attribute %s missing)
  marked for redelivery %d (attribute %s=1)
  expected unique keys  %d (what a dedup pipeline should emit)%s
  elapsed               %s
  rate                  %.1f messages/s, %.1f events/s
  seed                  %d (--seed %d replays this plan)
`, state, s.Topic, s.Events, s.Messages, s.Copies, s.RepublishedEvents,
		s.KeylessEvents, s.IDAttribute, s.RedeliverMarked, attrRedeliver, s.ExpectedUniqueKeys, unknown,
		time.Duration(s.ElapsedSeconds*float64(time.Second)).Round(time.Millisecond),
		s.MessagesPerSecond, s.EventsPerSecond, s.Seed, s.Seed)
	if err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	return nil
}

// progress shows acknowledged messages on stderr.
type progress interface {
	add(n int)
	finish(complete bool) // false: the run stopped short
}

func newProgress(mode string, w io.Writer, total int, every time.Duration) (progress, error) {
	if mode == "auto" {
		mode = "lines"
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			mode = "bar"
		}
	}
	switch mode {
	case "off":
		return noProgress{}, nil
	case "bar":
		return barProgress{progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("publishing"),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("msg"),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish(),
		)}, nil
	case "lines":
		return newLineProgress(w, total, every), nil
	}
	return nil, fmt.Errorf("--progress %q: want auto, bar, lines or off", mode)
}

type noProgress struct{}

func (noProgress) add(int)     {}
func (noProgress) finish(bool) {}

type barProgress struct{ b *progressbar.ProgressBar }

func (p barProgress) add(n int) { _ = p.b.Add(n) }
func (p barProgress) finish(complete bool) {
	if complete {
		_ = p.b.Finish()
		return
	}
	// Finish would fill the bar to 100%: leave it where the run stopped.
	_ = p.b.Exit()
}

// lineProgress prints a plain line now and then, for logs and pipes
// where a redrawn bar would be noise. Its ticker goroutine is stopped and
// waited for by finish.
type lineProgress struct {
	w     io.Writer
	total int
	start time.Time
	n     atomic.Int64
	stop  chan struct{}
	wg    sync.WaitGroup
}

func newLineProgress(w io.Writer, total int, every time.Duration) *lineProgress {
	p := &lineProgress{w: w, total: total, start: time.Now(), stop: make(chan struct{})}
	p.wg.Go(func() {
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-p.stop:
				return
			case <-t.C:
				p.line("")
			}
		}
	})
	return p
}

func (p *lineProgress) add(n int) { p.n.Add(int64(n)) }

func (p *lineProgress) finish(complete bool) {
	close(p.stop)
	p.wg.Wait()
	if complete {
		p.line(", done")
		return
	}
	p.line(", stopped before the end")
}

func (p *lineProgress) line(suffix string) {
	n := p.n.Load()
	pct := 100.0
	if p.total > 0 {
		pct = 100 * float64(n) / float64(p.total)
	}
	rate := float64(n) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "loadgen: %d/%d messages (%.0f%%), %.0f messages/s%s\n", n, p.total, pct, rate, suffix)
}
