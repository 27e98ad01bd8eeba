package pubsubio

import (
	"context"
	"errors"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/pipeline"
)

// TopicSink publishes messages to a topic and returns once the server
// acknowledged the publish.
type TopicSink struct {
	p *pubsub.Publisher
}

var _ pipeline.Sink = (*TopicSink)(nil)

// NewTopicSink publishes to topic through c. Publish attempts give up after
// timeout, so a write never outlives the claim lease that guards it.
func NewTopicSink(c *pubsub.Client, topic Name, timeout time.Duration) *TopicSink {
	p := c.Publisher(topic.String())
	p.PublishSettings.Timeout = timeout
	p.PublishSettings.CountThreshold = 500
	p.PublishSettings.DelayThreshold = 5 * time.Millisecond
	return &TopicSink{p: p}
}

// Write implements pipeline.Sink.
func (s *TopicSink) Write(ctx context.Context, m *pipeline.Message) error {
	// Publish reads its context only for stats tags and tracing, and
	// looking a tag up walks the whole chain of the message's context
	// (10% of the pipeline's CPU in a profile); the wait below is what
	// must honour ctx.
	r := s.p.Publish(context.Background(), &pubsub.Message{Data: m.Data, Attributes: m.Attributes})
	if _, err := r.Get(ctx); err != nil {
		if status.Code(err) == codes.InvalidArgument || errors.Is(err, pubsub.ErrOversizedMessage) {
			return fmt.Errorf("publish to %s: %w: %w", s.p, pipeline.ErrPermanent, err)
		}
		return fmt.Errorf("publish to %s: %w", s.p, err)
	}
	return nil
}

// Stop flushes what is queued and stops the publisher.
func (s *TopicSink) Stop() { s.p.Stop() }
