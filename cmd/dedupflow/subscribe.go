package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/googleapis/gax-go/v2"

	"github.com/dedupflow/dedupflow/pubsubio"
)

// runSubscribe is the tutorial's consumer app: it prints every message of a
// subscription and acks it.
func runSubscribe(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		project, subName string
		asJSON           bool
		count            int
		lf               logFlags
	)
	fs := newFlags("subscribe", stderr)
	defer func() { err = envNamed(fs, err) }()
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
	if _, err := pubsubio.CheckSubscription(ctx, c, name); err != nil {
		return topicHint(ctx, c, name, err)
	}
	return subscribe(ctx, c.SubscriptionAdminClient, name.String(), stdout, asJSON, count)
}

// topicHint adds to err, that subscription s does not exist, what to do
// when s names a topic: messages are read from a subscription of it.
func topicHint(ctx context.Context, c *pubsub.Client, s pubsubio.Name, err error) error {
	t := pubsubio.Name{Project: s.Project, Kind: "topics", ID: s.ID}
	if _, terr := c.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: t.String()}); terr != nil {
		return err
	}
	return fmt.Errorf("%w; %s is a topic: read it through a subscription of it (gcloud pubsub subscriptions create %s-sub --topic %s, then --subscription %s-sub)",
		err, s.ID, s.ID, s.ID, s.ID)
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

// pullBatch is the most messages one pull asks for.
const pullBatch = 100

// acker is what subscribe needs of the client: the unary Pub/Sub calls.
type acker interface {
	Pull(ctx context.Context, req *pubsubpb.PullRequest, opts ...gax.CallOption) (*pubsubpb.PullResponse, error)
	Acknowledge(ctx context.Context, req *pubsubpb.AcknowledgeRequest, opts ...gax.CallOption) error
	ModifyAckDeadline(ctx context.Context, req *pubsubpb.ModifyAckDeadlineRequest, opts ...gax.CallOption) error
}

// subscribe prints and acks the messages of sub until ctx is done or,
// with count > 0, count messages have been printed.
//
// It pulls, prints and acks one batch at a time, as gcloud's pull does,
// and returns only once the server has answered the acks. The client's
// streaming Receive did not fit: stopped right after an ack it could drop
// the ack unsent (its stream's end stops the goroutine that sends acks),
// or, stopped more gently, take more messages that nobody then read;
// either way messages came back after subscribe --count had printed them
// or left them out.
func subscribe(ctx context.Context, c acker, sub string, w io.Writer, asJSON bool, count int) error {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for printed := 0; count == 0 || printed < count; {
		n := pullBatch
		if count > 0 {
			n = min(n, count-printed)
		}
		res, err := c.Pull(ctx, &pubsubpb.PullRequest{Subscription: sub, MaxMessages: int32(n)})
		if err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting: nothing was taken
			}
			return fmt.Errorf("pull: %w", err)
		}
		var done, back []string
		var werr error
		for _, rm := range res.ReceivedMessages {
			if werr == nil {
				werr = printMessage(w, enc, asJSON, rm)
			}
			if werr != nil {
				back = append(back, rm.AckId)
				continue
			}
			done = append(done, rm.AckId)
		}
		// What was printed is acked, and what was not goes back at
		// once, even when a stop came meanwhile.
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), stopGrace)
		var aerr error
		if len(done) > 0 {
			if err := c.Acknowledge(actx, &pubsubpb.AcknowledgeRequest{Subscription: sub, AckIds: done}); err != nil {
				aerr = fmt.Errorf("the server is unreachable or slow: %d printed messages are not acknowledged and will be delivered again: %w", len(done), err)
			}
		}
		if len(back) > 0 {
			_ = c.ModifyAckDeadline(actx, &pubsubpb.ModifyAckDeadlineRequest{Subscription: sub, AckIds: back})
		}
		cancel()
		switch {
		case werr != nil:
			// Output is gone (a closed pipe).
			return errors.Join(fmt.Errorf("write message: %w", werr), aerr)
		case aerr != nil:
			return aerr
		case ctx.Err() != nil:
			return nil
		}
		printed += len(done)
	}
	return nil
}

// printMessage writes one message, as the tutorial's app does or as JSON.
func printMessage(w io.Writer, enc *json.Encoder, asJSON bool, rm *pubsubpb.ReceivedMessage) error {
	m := rm.GetMessage()
	if !asJSON {
		// Quoted, so a payload cannot move the cursor or forge lines on
		// the reader's terminal.
		_, err := fmt.Fprintf(w, "Received message: %s.\n", strconv.Quote(string(m.GetData())))
		return err
	}
	r := received{Attributes: m.GetAttributes(), MessageID: m.GetMessageId(), PublishTime: m.GetPublishTime().AsTime().UTC(),
		OrderingKey: m.GetOrderingKey()}
	if r.Attributes == nil {
		r.Attributes = map[string]string{}
	}
	if a := int(rm.GetDeliveryAttempt()); a > 0 {
		r.DeliveryAttempt = &a
	}
	if utf8.Valid(m.GetData()) {
		s := string(m.GetData())
		r.Data = &s
	} else {
		r.DataBase64 = m.GetData()
	}
	return enc.Encode(r)
}
