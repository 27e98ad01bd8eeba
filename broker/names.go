package broker

import (
	"strings"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of the real service; the broker enforces the same ones so that code
// which works here does not fail the first time it meets Google's servers.
const (
	maxMessageBytes   = 10 << 20 // data plus attributes of one message
	maxRequestBytes   = 10 << 20 // one PublishRequest
	maxAttributes     = 100
	maxAttrKeyBytes   = 256
	maxAttrValueBytes = 1024
	maxOrderingKey    = 1024
	minAckDeadline    = 10
	maxAckDeadline    = 600
	minDeadLetterTry  = 5
	maxDeadLetterTry  = 100
	deletedTopic      = "_deleted-topic_"
)

// validID reports whether id is a valid topic, subscription or snapshot ID:
// 3 to 255 characters, starting with a letter, of [A-Za-z0-9-_.~+%], and not
// starting with "goog".
func validID(id string) bool {
	if len(id) < 3 || len(id) > 255 || strings.HasPrefix(strings.ToLower(id), "goog") {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		letter := (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
		switch {
		case letter:
		case i == 0:
			return false
		case c >= '0' && c <= '9', c == '-', c == '_', c == '.', c == '~', c == '+', c == '%':
		default:
			return false
		}
	}
	return true
}

// parseName checks a resource name of the form projects/P/<kind>/ID and
// returns the project and the ID.
func parseName(name, kind string) (project, id string, err error) {
	parts := strings.Split(name, "/")
	if len(parts) != 4 || parts[0] != "projects" || parts[1] == "" || parts[2] != kind {
		return "", "", status.Errorf(codes.InvalidArgument, "invalid %s name %q: want projects/{project}/%s/{id}", strings.TrimSuffix(kind, "s"), name, kind)
	}
	if !validID(parts[3]) {
		return "", "", status.Errorf(codes.InvalidArgument,
			"invalid %s name %q: the ID must be 3-255 characters, start with a letter, contain only letters, digits and - _ . ~ + %%, and not start with \"goog\"",
			strings.TrimSuffix(kind, "s"), name)
	}
	return parts[1], parts[3], nil
}

// checkMessage enforces the service's per-message limits and returns the
// message's size. i is the index in the request, so that the error names
// the offending message.
func checkMessage(i int, m *pb.PubsubMessage) (int, error) {
	if len(m.Data) == 0 && len(m.Attributes) == 0 {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: a message needs non-empty data or at least one attribute", i)
	}
	if len(m.Attributes) > maxAttributes {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: %d attributes, the limit is %d", i, len(m.Attributes), maxAttributes)
	}
	size := len(m.Data) + len(m.OrderingKey)
	for k, v := range m.Attributes {
		if k == "" {
			return 0, status.Errorf(codes.InvalidArgument, "message %d: an attribute key is empty", i)
		}
		if len(k) > maxAttrKeyBytes {
			return 0, status.Errorf(codes.InvalidArgument, "message %d: attribute key %.40q... is %d bytes, the limit is %d", i, k, len(k), maxAttrKeyBytes)
		}
		if len(v) > maxAttrValueBytes {
			return 0, status.Errorf(codes.InvalidArgument, "message %d: the value of attribute %q is %d bytes, the limit is %d", i, k, len(v), maxAttrValueBytes)
		}
		size += len(k) + len(v)
	}
	if len(m.OrderingKey) > maxOrderingKey {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: ordering key is %d bytes, the limit is %d", i, len(m.OrderingKey), maxOrderingKey)
	}
	if !utf8.ValidString(m.OrderingKey) {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: ordering key is not valid UTF-8", i)
	}
	if size > maxMessageBytes {
		return 0, status.Errorf(codes.InvalidArgument, "message %d: %d bytes, the limit is %d", i, size, maxMessageBytes)
	}
	return size, nil
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
		s.MessageRetentionDuration = durationpbOf(defaultRetention)
	}
	if d := s.MessageRetentionDuration.AsDuration(); d < minRetention || d > maxRetention {
		return status.Errorf(codes.InvalidArgument, "message_retention_duration is %v, it must be between %v and %v", d, minRetention, maxRetention)
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
			p.MinimumBackoff = durationpbOf(defaultMinBackoff)
		}
		if p.MaximumBackoff == nil {
			p.MaximumBackoff = durationpbOf(defaultMaxBackoff)
		}
		lo, hi := p.MinimumBackoff.AsDuration(), p.MaximumBackoff.AsDuration()
		if lo < 0 || hi > defaultMaxBackoff || lo > hi {
			return status.Errorf(codes.InvalidArgument, "retry_policy: backoffs must satisfy 0 <= minimum (%v) <= maximum (%v) <= %v", lo, hi, defaultMaxBackoff)
		}
	}
	if s.Filter != "" {
		return status.Error(codes.Unimplemented, "subscription filters are not supported by this broker")
	}
	if s.PushConfig.GetPushEndpoint() != "" || s.BigqueryConfig != nil || s.CloudStorageConfig != nil {
		return status.Error(codes.Unimplemented, "push, BigQuery and Cloud Storage subscriptions are not supported by this broker")
	}
	return nil
}
