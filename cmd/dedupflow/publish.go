package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// runPublish is the tutorial's producer: it publishes one event with a
// stable key, and with --copies N publishes it N times as separate messages
// with that one key — acting out a producer whose retry followed a lost
// response, which is the duplicate a dedup pipeline must drop.
func runPublish(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		project, topicName, data, file, key, idAttr, tsAttr string
		copies, maxAttempts                                 int
		attrs                                               = attrFlag{}
		lf                                                  logFlags
	)
	fs := newFlags("publish", stderr)
	defer func() { err = envNamed(fs, err) }()
	fs.StringVar(&project, "project", "", "Google Cloud project of a short topic ID")
	fs.StringVar(&topicName, "topic", "", "topic to publish to (ID or projects/P/topics/T)")
	fs.StringVar(&data, "data", "", "message data, as text")
	fs.StringVar(&file, "file", "", "read the message data from this file")
	fs.Var(attrs, "attr", "attribute name=value; repeat for more")
	fs.IntVar(&copies, "copies", 1, "publish the event this many times, as separate messages with the same key")
	fs.StringVar(&key, "key", "", "the event's key (default: a new UUIDv7; --key '' publishes without one, as the console's empty Key does)")
	resolveID := idAttributeVar(fs, &idAttr, "attribute the key is stamped into: the pipeline's and up's --id-attribute")
	fs.StringVar(&tsAttr, "timestamp-attribute", "", "attribute to stamp the event time into, in ms since the epoch (empty: none)")
	fs.IntVar(&maxAttempts, "max-attempts", publisher.DefaultMaxAttempts, "attempts per message before giving up")
	lf.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dedupflow publish --topic T (--data TEXT | --file F) [--attr k=v]... [--key K] [--copies N]")
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
	set := given(fs)
	switch {
	case topicName == "":
		return errors.New("missing --topic")
	case set["data"] && set["file"]:
		return errors.New("give --data or --file, not both")
	case !set["data"] && !set["file"]:
		return errors.New("missing message data: give --data TEXT or --file F (--data '' for attributes only)")
	case copies < 1:
		return fmt.Errorf("--copies %d must be at least 1", copies)
	case idAttr == "":
		return errors.New("--id-attribute must not be empty")
	case maxAttempts < 1:
		return fmt.Errorf("--max-attempts %d must be at least 1", maxAttempts)
	}
	// The pipeline's rule for keys, so a key it would refuse is refused
	// here, before it is published.
	if err := dedup.CheckKey(key); err != nil {
		return fmt.Errorf("--key %s: %w", logfmt(key), err)
	}
	// The library would name its field (Key), not the flags the user typed.
	if v, ok := attrs[idAttr]; ok && key != "" && v != key {
		return fmt.Errorf("%w: --key %q but --attr %s=%q: give the key once", publisher.ErrKeyConflict, key, idAttr, v)
	}
	body := []byte(data)
	if set["file"] {
		if body, err = os.ReadFile(file); err != nil {
			return fmt.Errorf("read --file: %w", err)
		}
	}
	p, raw, closePub, err := openPublisher(ctx, project, topicName, publisher.Options{
		IDAttribute: idAttr, TimestampAttribute: tsAttr, MaxAttempts: maxAttempts, Logger: log,
	})
	if err != nil {
		return err
	}
	defer closePub()
	e := publisher.Event{Key: key, Data: body, Attributes: attrs}
	if _, ok := attrs[tsAttr]; tsAttr != "" && !ok {
		// One event time for all copies: they are one event.
		e.Time = time.Now()
	}
	if set["key"] && key == "" {
		return publishKeyless(ctx, raw, e, tsAttr, copies, stdout)
	}
	return publishCopies(ctx, p, e, copies, stdout)
}

// publishKeyless publishes e copies times without a key, as a producer
// that stamps none does: the pipeline counts each as missing its key and
// dedups it by message ID, so its copies all pass.
func publishKeyless(ctx context.Context, pub *pubsub.Publisher, e publisher.Event, tsAttr string, copies int, stdout io.Writer) error {
	attrs := maps.Clone(e.Attributes)
	if !e.Time.IsZero() {
		attrs[tsAttr] = strconv.FormatInt(e.Time.UnixMilli(), 10)
	}
	for i := 1; i <= copies; i++ {
		id, err := pub.Publish(ctx, &pubsub.Message{Data: e.Data, Attributes: attrs}).Get(ctx)
		if err != nil {
			return fmt.Errorf("copy %d of %d: %w", i, copies, err)
		}
		line := "message_id=" + logfmt(id) + " (no key)"
		if copies > 1 {
			line += fmt.Sprintf(" copy=%d/%d", i, copies)
		}
		if _, err := fmt.Fprintln(stdout, line); err != nil {
			return fmt.Errorf("write message ID: %w", err)
		}
	}
	return nil
}

// publishCopies publishes e copies times, one after another as a retrying
// producer would, and prints each message ID. The key (and the event time)
// are fixed by the first publish and reused by the others.
func publishCopies(ctx context.Context, p *publisher.Publisher, e publisher.Event, copies int, stdout io.Writer) error {
	for i := 1; i <= copies; i++ {
		r := p.Publish(ctx, e)
		id, err := r.Get(ctx)
		if err != nil {
			if copies > 1 {
				return fmt.Errorf("copy %d of %d: %w", i, copies, err)
			}
			return err
		}
		e.Key = r.Key()
		line := fmt.Sprintf("message_id=%s %s=%s", logfmt(id), logfmt(p.IDAttribute()), logfmt(r.Key()))
		if copies > 1 {
			line += fmt.Sprintf(" copy=%d/%d", i, copies)
		}
		if _, err := fmt.Fprintln(stdout, line); err != nil {
			return fmt.Errorf("write message ID: %w", err)
		}
	}
	return nil
}

// logfmt quotes s unless it is a plain word, so a key with spaces, quotes
// or control characters cannot garble the line or the terminal.
func logfmt(s string) string {
	if s == "" || strings.ContainsFunc(s, func(r rune) bool {
		return r <= ' ' || r == '"' || r == '=' || r == '\\' || r >= 0x7f
	}) {
		return strconv.Quote(s)
	}
	return s
}

// attrFlag collects repeated --attr name=value flags.
type attrFlag map[string]string

func (a attrFlag) String() string {
	var s []string
	for _, k := range slices.Sorted(maps.Keys(a)) {
		s = append(s, k+"="+a[k])
	}
	return strings.Join(s, ",")
}

func (a attrFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	switch {
	case !ok:
		return fmt.Errorf("%q has no '=': want name=value", s)
	case name == "":
		return fmt.Errorf("%q has an empty attribute name: want name=value", s)
	}
	if _, dup := a[name]; dup {
		return fmt.Errorf("attribute %q given twice", name)
	}
	a[name] = value
	return nil
}

// openPublisher connects to the topic named by --project and --topic and
// wraps its publisher in the stable-key helper; close stops both.
func openPublisher(ctx context.Context, project, topicName string, o publisher.Options) (*publisher.Publisher, *pubsub.Publisher, func(), error) {
	topic, err := pubsubio.TopicName(project, topicName)
	if err != nil {
		return nil, nil, nil, err
	}
	c, err := pubsubio.NewClient(ctx, clientProject(project, topic))
	if err != nil {
		return nil, nil, nil, err
	}
	pub := c.Publisher(topic.String())
	closeAll := func() { stopPublisher(ctx, pub); c.Close() }
	p, err := publisher.New(pub, o)
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	return p, pub, closeAll, nil
}

// stopGiveUp bounds the wait for the client's Stop once the command was
// stopped (Ctrl-C, SIGTERM).
const stopGiveUp = time.Second

// stopPublisher stops pub, sending what it holds. Its Stop waits for each
// message's answer, up to the client's 60 s timeout: after a stop, with a
// server that does not answer, the command would hang that long, so it
// waits stopGiveUp and leaves the client's goroutines to the exit. What
// was not answered counts as not published.
func stopPublisher(ctx context.Context, pub *pubsub.Publisher) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		pub.Stop()
	}()
	select {
	case <-done:
		return
	case <-ctx.Done():
	}
	t := time.NewTimer(stopGiveUp)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}
