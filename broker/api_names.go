package broker

import (
	"slices"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/filter"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Limits the broker applies beyond package limits' message and name limits.
const (
	minAckDeadline   = 10
	maxAckDeadline   = 600
	minDeadLetterTry = 5
	maxDeadLetterTry = 100
	deletedTopic     = "_deleted-topic_"
)

// parseName checks a resource name of the form projects/P/<kind>/ID and
// returns the project and the ID.
func parseName(name, kind string) (project, id string, err error) {
	parts := strings.Split(name, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[1] == "" || parts[2] != kind {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: want projects/{project}/%s/{id}", strings.TrimSuffix(kind, "s"), name, kind)
	}
	if err := limits.Project(parts[1]); err != nil {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: %v", strings.TrimSuffix(kind, "s"), name, err)
	}
	if err := limits.ID(parts[3]); err != nil {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: %v", strings.TrimSuffix(kind, "s"), name, err)
	}
	return parts[1], parts[3], nil
}

// checkMessage enforces the service's per-message limits and returns the
// message's size. i is the index in the request, so that the error names
// the offending message.
func checkMessage(i int, m *pb.PubsubMessage) (int, error) {
	n, err := limits.Message(m.Data, m.Attributes, m.OrderingKey)
	if err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: %v", i, err)
	}
	return n, nil
}

func checkLabels(labels map[string]string) error {
	if err := limits.Labels(labels); err != nil {
		return status.Errorf(codes.InvalidArgument, "labels: %v", err)
	}
	return nil
}

// isKMSKey tells whether name has the form of a Cloud KMS key's name, which
// the broker stores but does not use.
func isKMSKey(name string) bool {
	p := strings.Split(name, "/")
	return len(p) == 8 && p[0] == "projects" && p[2] == "locations" && p[4] == "keyRings" && p[6] == "cryptoKeys" &&
		!slices.Contains(p, "")
}

// checkTopicConfig validates the settings of a topic to create or update.
func checkTopicConfig(tp *pb.Topic) error {
	if d := tp.MessageRetentionDuration; d != nil && (d.AsDuration() < minRetention || d.AsDuration() > maxRetention) {
		return status.Errorf(codes.InvalidArgument, "message_retention_duration is %v, it must be between %v and %v", d.AsDuration(), minRetention, maxRetention)
	}
	if err := checkLabels(tp.Labels); err != nil {
		return err
	}
	if k := tp.KmsKeyName; k != "" && !isKMSKey(k) {
		return status.Errorf(codes.InvalidArgument, "kms_key_name %q: want projects/{project}/locations/{location}/keyRings/{ring}/cryptoKeys/{key}", k)
	}
	if p := tp.MessageStoragePolicy; p != nil && len(p.AllowedPersistenceRegions) == 0 {
		return status.Error(codes.InvalidArgument, "message_storage_policy.allowed_persistence_regions is empty: a policy must allow at least one region (leave the policy out for no constraint)")
	}
	return checkTransforms(tp.MessageTransforms)
}

// checkSubscriptionConfig validates the settings the broker interprets and
// fills in the service's defaults, so that Get returns what the service would.
func checkSubscriptionConfig(s *pb.Subscription) error {
	if s.AckDeadlineSeconds == 0 {
		s.AckDeadlineSeconds = minAckDeadline
	}
	if s.AckDeadlineSeconds < minAckDeadline || s.AckDeadlineSeconds > maxAckDeadline {
		return status.Errorf(codes.InvalidArgument, "ack_deadline_seconds is %d, it must be between %d and %d", s.AckDeadlineSeconds, minAckDeadline, maxAckDeadline)
	}
	if s.MessageRetentionDuration == nil {
		s.MessageRetentionDuration = durationpb.New(defaultRetention)
	}
	if d := s.MessageRetentionDuration.AsDuration(); d < minRetention || d > maxRetention {
		return status.Errorf(codes.InvalidArgument, "message_retention_duration is %v, it must be between %v and %v", d, minRetention, maxRetention)
	}
	if err := checkLabels(s.Labels); err != nil {
		return err
	}
	if err := checkTransforms(s.MessageTransforms); err != nil {
		return err
	}
	if s.ExpirationPolicy == nil {
		s.ExpirationPolicy = &pb.ExpirationPolicy{Ttl: durationpb.New(defaultExpiration)}
	}
	if ttl := s.ExpirationPolicy.Ttl; ttl != nil && ttl.AsDuration() < minExpiration {
		return status.Errorf(codes.InvalidArgument, "expiration_policy.ttl is %v, the minimum is %v (leave ttl out for a subscription that never expires)", ttl.AsDuration(), minExpiration)
	}
	if p := s.DeadLetterPolicy; p != nil {
		if p.MaxDeliveryAttempts == 0 {
			p.MaxDeliveryAttempts = minDeadLetterTry
		}
		if p.MaxDeliveryAttempts < minDeadLetterTry || p.MaxDeliveryAttempts > maxDeadLetterTry {
			return status.Errorf(codes.InvalidArgument, "dead_letter_policy.max_delivery_attempts is %d, it must be between %d and %d", p.MaxDeliveryAttempts, minDeadLetterTry, maxDeadLetterTry)
		}
		if _, _, err := parseName(p.DeadLetterTopic, "topics"); err != nil {
			return err
		}
	}
	if p := s.RetryPolicy; p != nil {
		if p.MinimumBackoff == nil {
			p.MinimumBackoff = durationpb.New(defaultMinBackoff)
		}
		if p.MaximumBackoff == nil {
			p.MaximumBackoff = durationpb.New(defaultMaxBackoff)
		}
		lo, hi := p.MinimumBackoff.AsDuration(), p.MaximumBackoff.AsDuration()
		if lo < 0 || hi > defaultMaxBackoff || lo > hi {
			return status.Errorf(codes.InvalidArgument, "retry_policy: backoffs must satisfy 0 <= minimum (%v) <= maximum (%v) <= %v", lo, hi, defaultMaxBackoff)
		}
	}
	if _, err := filter.Parse(s.Filter); err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid filter %q: %v", s.Filter, err)
	}
	if err := checkExportConfig(s); err != nil {
		return err
	}
	if s.PushConfig == nil {
		s.PushConfig = &pb.PushConfig{} // a pull subscription, shown so by the service
	}
	return checkPushConfig(s.PushConfig)
}
