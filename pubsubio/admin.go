package pubsubio

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// EnsureTopic creates the topic unless it exists.
func EnsureTopic(ctx context.Context, c *pubsub.Client, t Name) error {
	_, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: t.String()})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create topic %s: %w", t, err)
	}
	return nil
}

// EnsureSubscription creates a subscription to topic unless it exists.
func EnsureSubscription(ctx context.Context, c *pubsub.Client, s, topic Name, ackDeadlineSeconds int32) error {
	_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: s.String(), Topic: topic.String(), AckDeadlineSeconds: ackDeadlineSeconds,
	})
	if err != nil && status.Code(err) != codes.AlreadyExists {
		return fmt.Errorf("create subscription %s: %w", s, err)
	}
	return nil
}

// TempSubscription creates a subscription of its own on topic, in project
// (the pipeline's, which may not be the topic's), named after it as Dataflow
// does, for a pipeline started with --input-topic. Like any new
// subscription it sees only messages published from now on.
func TempSubscription(ctx context.Context, c *pubsub.Client, project string, topic Name, ackDeadlineSeconds int32) (Name, error) {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return Name{}, fmt.Errorf("name subscription: %w", err)
	}
	id := topic.ID + ".dedupflow-" + hex.EncodeToString(b[:])
	if len(id) > 255 {
		id = "dedupflow-" + hex.EncodeToString(b[:])
	}
	s := Name{Project: project, Kind: "subscriptions", ID: id}
	_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: s.String(), Topic: topic.String(), AckDeadlineSeconds: ackDeadlineSeconds,
		// A pipeline that dies without removing it leaves no subscription
		// piling up a backlog for ever: the service removes it after a day
		// unused (its shortest expiration).
		ExpirationPolicy: &pubsubpb.ExpirationPolicy{Ttl: durationpb.New(24 * time.Hour)},
	})
	if err != nil {
		return Name{}, fmt.Errorf("create subscription on %s: %w", topic, err)
	}
	return s, nil
}

// DeleteSubscription removes a subscription.
func DeleteSubscription(ctx context.Context, c *pubsub.Client, s Name) error {
	err := c.SubscriptionAdminClient.DeleteSubscription(ctx, &pubsubpb.DeleteSubscriptionRequest{Subscription: s.String()})
	if err != nil && status.Code(err) != codes.NotFound {
		return fmt.Errorf("delete subscription %s: %w", s, err)
	}
	return nil
}

// CheckTopic reports a topic that does not exist, so a typo in a flag fails
// at start rather than as an endless "sink unreachable". Without the right
// to read topic metadata (a publish-only account) it cannot tell, and says
// nothing.
func CheckTopic(ctx context.Context, c *pubsub.Client, t Name) error {
	_, err := c.TopicAdminClient.GetTopic(ctx, &pubsubpb.GetTopicRequest{Topic: t.String()})
	return existence("topic", t, err)
}

// CheckSubscription is CheckTopic for a subscription, and returns the
// topic it reads. A subscriber without the right to read its metadata
// (roles/pubsub.subscriber lacks it) cannot tell, and is let through with
// an empty topic.
func CheckSubscription(ctx context.Context, c *pubsub.Client, s Name) (topic string, err error) {
	sub, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pubsubpb.GetSubscriptionRequest{Subscription: s.String()})
	return sub.GetTopic(), existence("subscription", s, err)
}

// existence turns the answer to a Get of a resource into what the checks
// report.
func existence(kind string, n Name, err error) error {
	switch status.Code(err) {
	case codes.OK, codes.PermissionDenied, codes.Unimplemented:
		return nil
	case codes.NotFound:
		return fmt.Errorf("%s %s does not exist", kind, n)
	}
	return fmt.Errorf("look up %s %s: %w", kind, n, err)
}
