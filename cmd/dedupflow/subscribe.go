package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
)

// runSubscribe is the tutorial's consumer app: it prints every message of a
// subscription and acks it.
func runSubscribe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var (
		project, subName string
		asJSON           bool
		count            int
		lf               logFlags
	)
	fs := newFlags("subscribe", stderr)
	fs.StringVar(&project, "project", "", "Google Cloud project of a short subscription ID")
	fs.StringVar(&subName, "subscription", "", "subscription to read (ID or projects/P/subscriptions/S)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object per message: data, attributes, message ID, publish time")
	fs.IntVar(&count, "count", 0, "exit after this many messages (0: run until interrupted)")
	lf.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: dedupflow subscribe --subscription S [--project P] [--json] [--count N]\n\n"+
			"Prints and acks the messages of a subscription, as the tutorial's consumer app does.\n\n")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if _, err := lf.logger(stderr); err != nil {
		return err
	}
	if subName == "" {
		return errors.New("missing --subscription")
	}
	if count < 0 {
		return fmt.Errorf("--count %d must not be negative", count)
	}
	name, err := pubsubio.SubscriptionName(project, subName)
	if err != nil {
		return err
	}
	c, err := pubsubio.NewClient(ctx, clientProject(project, name))
	if err != nil {
		return err
	}
	defer c.Close()
	return subscribe(ctx, c.Subscriber(name.String()), stdout, asJSON, count)
}

// received is the --json form of one message.
type received struct {
	Data            *string           `json:"data,omitempty"`
	DataBase64      []byte            `json:"data_base64,omitempty"` // when the payload is not UTF-8
	Attributes      map[string]string `json:"attributes"`
	MessageID       string            `json:"message_id"`
	PublishTime     time.Time         `json:"publish_time"`
	OrderingKey     string            `json:"ordering_key,omitempty"`
	DeliveryAttempt *int              `json:"delivery_attempt,omitempty"`
}

// subscribe prints and acks messages until ctx is done or, with count > 0,
// count messages have been printed. Messages received beyond count are
// nacked, not dropped, so another reader gets them.
func subscribe(ctx context.Context, sub *pubsub.Subscriber, w io.Writer, asJSON bool, count int) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if count > 0 {
		sub.ReceiveSettings.MaxOutstandingMessages = count
		// The client may hold messages it fetched and not yet handed to
		// the callback when the count is reached: they go back at once
		// instead of waiting out their ack deadline.
		sub.ReceiveSettings.ShutdownOptions = &pubsub.ShutdownOptions{Behavior: pubsub.ShutdownBehaviorNackImmediately, Timeout: stopGrace}
	}
	var (
		mu      sync.Mutex // orders lines and guards printed and werr
		printed int
		werr    error
	)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	err := pubsubio.StopWithin(sub, stopGrace).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		mu.Lock()
		defer mu.Unlock()
		if (count > 0 && printed >= count) || werr != nil {
			m.Nack()
			return
		}
		var err error
		if asJSON {
			r := received{Attributes: m.Attributes, MessageID: m.ID, PublishTime: m.PublishTime.UTC(),
				OrderingKey: m.OrderingKey, DeliveryAttempt: m.DeliveryAttempt}
			if r.Attributes == nil {
				r.Attributes = map[string]string{}
			}
			if utf8.Valid(m.Data) {
				s := string(m.Data)
				r.Data = &s
			} else {
				r.DataBase64 = m.Data
			}
			err = enc.Encode(r)
		} else {
			// Quoted, so a payload cannot move the cursor or forge lines
			// on the reader's terminal.
			_, err = fmt.Fprintf(w, "Received message: %s.\n", strconv.Quote(string(m.Data)))
		}
		if err != nil {
			// Output is gone (a closed pipe): stop, and let the message
			// come back to a reader that can show it.
			werr = fmt.Errorf("write message: %w", err)
			m.Nack()
			cancel()
			return
		}
		m.Ack()
		printed++
		if count > 0 && printed == count {
			cancel()
		}
	})
	mu.Lock()
	defer mu.Unlock()
	if werr != nil {
		return werr
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("receive: %w", err)
	}
	return nil
}
