package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// Field-by-field fidelity to the service's v1 API: update masks, output-only
// fields, defaults and the refusals, with the service's codes and texts.

func mask(paths ...string) *fieldmaskpb.FieldMask { return &fieldmaskpb.FieldMask{Paths: paths} }

// wantStatus fails t unless err has code and its message holds text.
func wantStatus(t *testing.T, what string, err error, code codes.Code, text string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), text) {
		t.Errorf("%s: got %v, want %v with %q", what, err, code, text)
	}
}

// TestUpdateTopicSchemaSettingsPaths sends the dotted paths that the Go
// client's topic update sends for schema settings.
func TestUpdateTopicSchemaSettingsPaths(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		sc := schemaClient(t, tg.addr)
		ctx := context.Background()
		sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: unique("sch"),
			Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
		if err != nil {
			t.Fatal(err)
		}
		rev2, err := sc.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: sch.Name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro2}})
		if err != nil {
			t.Fatal(err)
		}
		topic := topicName(unique("t"))
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic,
			SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_JSON}}); err != nil {
			t.Fatal(err)
		}
		up, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
			Topic: &pb.Topic{Name: topic, SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_BINARY,
				FirstRevisionId: sch.RevisionId, LastRevisionId: rev2.RevisionId}},
			UpdateMask: mask("schema_settings.schema", "schema_settings.encoding", "schema_settings.first_revision_id", "schema_settings.last_revision_id")})
		if err != nil {
			t.Fatalf("update with the client's schema_settings paths: %v", err)
		}
		got, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		for _, tp := range []*pb.Topic{up, got} {
			if ss := tp.SchemaSettings; ss.GetEncoding() != pb.Encoding_BINARY || ss.GetFirstRevisionId() != sch.RevisionId || ss.GetLastRevisionId() != rev2.RevisionId {
				t.Errorf("schema settings after the update: %v", ss)
			}
		}
		_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: topic}, UpdateMask: mask("schema_settings.nope")})
		wantStatus(t, "unknown nested path", err, codes.InvalidArgument, "schema_settings.nope is not a known Topic field")
		_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: topic}, UpdateMask: mask()})
		wantStatus(t, "empty mask", err, codes.InvalidArgument, "must contain a non-empty paths list")
	})
}

// TestUpdateSubscriptionNestedPaths changes one field of a nested message
// and keeps its siblings, and refuses what the service refuses.
func TestUpdateSubscriptionNestedPaths(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic, dl := createTopic(t, c), createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic,
		PushConfig:       &pb.PushConfig{PushEndpoint: "http://127.0.0.1:1/a", Attributes: map[string]string{"x-goog-version": "v1"}},
		DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dl, MaxDeliveryAttempts: 5}})
	up, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, PushConfig: &pb.PushConfig{PushEndpoint: "http://127.0.0.1:1/b"},
			DeadLetterPolicy: &pb.DeadLetterPolicy{MaxDeliveryAttempts: 9}},
		UpdateMask: mask("push_config.push_endpoint", "dead_letter_policy.max_delivery_attempts")})
	if err != nil {
		t.Fatal(err)
	}
	if pc := up.PushConfig; pc.GetPushEndpoint() != "http://127.0.0.1:1/b" || pc.GetAttributes()["x-goog-version"] != "v1" {
		t.Errorf("push config after updating its endpoint: %v", pc)
	}
	if p := up.DeadLetterPolicy; p.GetMaxDeliveryAttempts() != 9 || p.GetDeadLetterTopic() != dl {
		t.Errorf("dead-letter policy after updating its attempts: %v", p)
	}
	// Clearing a field of a message the subscription does not have leaves
	// it out; an empty ttl is "never expire".
	up, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, ExpirationPolicy: &pb.ExpirationPolicy{}},
		UpdateMask:   mask("retry_policy.minimum_backoff", "expiration_policy.ttl")})
	if err != nil || up.RetryPolicy != nil || up.ExpirationPolicy.GetTtl() != nil {
		t.Errorf("update of nested fields: %v %v", up, err)
	}
	for _, tc := range []struct{ path, text string }{
		{"push_config.nope", "push_config.nope is not a known Subscription field"},
		{"labels.a", "labels.a is not a known Subscription field"},
		{"state", "state is not a known Subscription field"},
		{"topic_message_retention_duration", "topic_message_retention_duration is not a known Subscription field"},
		{"name", "the name field in the Subscription is not mutable"},
		{"topic", "the topic field in the Subscription is not mutable"},
		{"enable_message_ordering", "the enable_message_ordering field in the Subscription is not mutable"},
		{"filter", "the filter field in the Subscription is not mutable"},
		{"detached", "the detached field in the Subscription is not mutable"},
	} {
		_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
			Subscription: &pb.Subscription{Name: sub.Name}, UpdateMask: mask(tc.path)})
		wantStatus(t, tc.path, err, codes.InvalidArgument, tc.text)
	}
}

// TestUpdateImmutableFields runs the refusals that Google's emulator also
// implements side by side with it.
func TestUpdateImmutableFields(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		ctx := context.Background()
		topic := createTopic(t, c)
		sub := createSub(t, c, &pb.Subscription{Topic: topic})
		for _, tc := range []struct{ path, text string }{
			{"bogus", "Invalid update_mask provided in the UpdateSubscriptionRequest: bogus is not a known Subscription field"},
			{"state", "state is not a known Subscription field"},
			{"topic", "Invalid update_mask provided in the UpdateSubscriptionRequest: the topic field in the Subscription is not mutable."},
			{"enable_message_ordering", "the enable_message_ordering field in the Subscription is not mutable."},
			{"name", "the name field in the Subscription is not mutable."},
		} {
			_, err := c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
				Subscription: &pb.Subscription{Name: sub.Name, Topic: topic + "x", EnableMessageOrdering: true}, UpdateMask: mask(tc.path)})
			wantStatus(t, tc.path, err, codes.InvalidArgument, tc.text)
		}
		_, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: topic}, UpdateMask: mask("bogus")})
		wantStatus(t, "topic bogus", err, codes.InvalidArgument, "Invalid update_mask provided in the UpdateTopicRequest: bogus is not a known Topic field")
	})
}

// TestTopicRetentionOnSubscription: topic_message_retention_duration is
// output only, the topic's retention as the service shows it on each of its
// subscriptions, on create, get and list, and after the topic changes it.
func TestTopicRetentionOnSubscription(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic := topicName(unique("t"))
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic, MessageRetentionDuration: durationpb.New(2 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	// What a create request sets in output-only fields is ignored.
	created := createSub(t, c, &pb.Subscription{Topic: topic, State: pb.Subscription_RESOURCE_ERROR, Detached: true,
		TopicMessageRetentionDuration: durationpb.New(time.Minute)})
	if created.TopicMessageRetentionDuration.AsDuration() != 2*time.Hour || created.State != pb.Subscription_ACTIVE || created.Detached {
		t.Errorf("created: %v", created)
	}
	retention := func() (got []time.Duration) {
		s, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: created.Name})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, s.TopicMessageRetentionDuration.AsDuration())
		it := c.SubscriptionAdminClient.ListSubscriptions(ctx, &pb.ListSubscriptionsRequest{Project: "projects/" + project})
		for s, err := it.Next(); err != iterator.Done; s, err = it.Next() {
			if err != nil {
				t.Fatal(err)
			}
			if s.Name == created.Name {
				got = append(got, s.TopicMessageRetentionDuration.AsDuration())
			}
		}
		return got
	}
	if got := retention(); fmt.Sprint(got) != "[2h0m0s 2h0m0s]" {
		t.Errorf("get and list: %v, want 2h", got)
	}
	if _, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic: &pb.Topic{Name: topic, MessageRetentionDuration: durationpb.New(3 * time.Hour)}, UpdateMask: mask("message_retention_duration")}); err != nil {
		t.Fatal(err)
	}
	if got := retention(); fmt.Sprint(got) != "[3h0m0s 3h0m0s]" {
		t.Errorf("after the topic's update: %v, want 3h", got)
	}
	if err := c.TopicAdminClient.DeleteTopic(ctx, &pb.DeleteTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
	if got := retention(); fmt.Sprint(got) != "[0s 0s]" {
		t.Errorf("after the topic's deletion: %v, want none", got)
	}
}

// TestDefaultExpiration: without an expiration policy a subscription gets
// the service's 31 days; an empty ttl means never; under a day is refused.
func TestDefaultExpiration(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	def := createSub(t, c, &pb.Subscription{Topic: topic})
	if ttl := def.ExpirationPolicy.GetTtl(); ttl.AsDuration() != 744*time.Hour {
		t.Errorf("default expiration: %v, want 744h", def.ExpirationPolicy)
	}
	never := createSub(t, c, &pb.Subscription{Topic: topic, ExpirationPolicy: &pb.ExpirationPolicy{}})
	if never.ExpirationPolicy == nil || never.ExpirationPolicy.Ttl != nil {
		t.Errorf("an empty ttl: %v, want never", never.ExpirationPolicy)
	}
	_, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic,
		ExpirationPolicy: &pb.ExpirationPolicy{Ttl: durationpb.New(23 * time.Hour)}})
	wantStatus(t, "ttl of 23h", err, codes.InvalidArgument, "expiration_policy.ttl")
	_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: never.Name, ExpirationPolicy: &pb.ExpirationPolicy{Ttl: durationpb.New(time.Hour)}},
		UpdateMask:   mask("expiration_policy.ttl")})
	wantStatus(t, "update to a ttl of 1h", err, codes.InvalidArgument, "expiration_policy.ttl")
}

// TestStoragePolicyNeedsARegion: a message storage policy that allows no
// region is not a valid configuration (the proto says so); the service
// refuses an update that removes every region.
func TestStoragePolicyNeedsARegion(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic := topicName(unique("t"))
	regions := &pb.MessageStoragePolicy{AllowedPersistenceRegions: []string{"europe-west1", "us-east1"}}
	if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topic, MessageStoragePolicy: regions}); err != nil {
		t.Fatal(err)
	}
	_, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic: &pb.Topic{Name: topic, MessageStoragePolicy: &pb.MessageStoragePolicy{}}, UpdateMask: mask("message_storage_policy")})
	wantStatus(t, "update to no region", err, codes.InvalidArgument, "allowed_persistence_regions")
	_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
		Topic: &pb.Topic{Name: topic}, UpdateMask: mask("message_storage_policy.allowed_persistence_regions")})
	wantStatus(t, "update of the regions to none", err, codes.InvalidArgument, "allowed_persistence_regions")
	_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), MessageStoragePolicy: &pb.MessageStoragePolicy{}})
	wantStatus(t, "create with no region", err, codes.InvalidArgument, "allowed_persistence_regions")
	got, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: topic})
	if err != nil || len(got.MessageStoragePolicy.GetAllowedPersistenceRegions()) != 2 {
		t.Errorf("the policy after refused updates: %v %v", got, err)
	}
	// Leaving the policy out of the update removes the constraint.
	up, err := c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: topic}, UpdateMask: mask("message_storage_policy")})
	if err != nil || up.MessageStoragePolicy != nil {
		t.Errorf("update without a policy: %v %v", up, err)
	}
}

// TestSeekFarAway seeks to times outside the years 1678-2262, which Unix
// nanoseconds cannot hold: 2999 is a purge (everything acknowledged), 1600
// keeps everything, as the docs say.
func TestSeekFarAway(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		topic := createTopic(t, c)
		past, future := createSub(t, c, &pb.Subscription{Topic: topic}), createSub(t, c, &pb.Subscription{Topic: topic})
		ids := publish(t, c, topic, &pubsub.Message{Data: []byte("a")}, &pubsub.Message{Data: []byte("b")}, &pubsub.Message{Data: []byte("c")})
		seekTo(t, c, past.Name, time.Date(1600, 1, 1, 0, 0, 0, 0, time.UTC))
		seekTo(t, c, future.Name, time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC))
		got := map[string]bool{}
		receive(t, c, past.Name, 30*time.Second, nil, func(m *pubsub.Message) (bool, bool) {
			got[m.ID] = true
			return true, len(got) == len(ids)
		})
		pullNone(t, c, future.Name, "a seek to 2999")
	})
}

// TestMalformedAckIDs: an ack ID that does not parse, or none at all, is
// INVALID_ARGUMENT for Acknowledge and ModifyAckDeadline, and aborts a
// StreamingPull stream, as the proto says; so does flow control set after
// a stream's first request.
func TestMalformedAckIDs(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		ctx := context.Background()
		sub := createSub(t, c, &pb.Subscription{Topic: createTopic(t, c)})
		sa := c.SubscriptionAdminClient
		err := sa.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub.Name, AckIds: []string{"not an ack ID!"}})
		wantStatus(t, "ack", err, codes.InvalidArgument, "Invalid ack id")
		err = sa.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub.Name})
		wantStatus(t, "ack of nothing", err, codes.InvalidArgument, "No ack ids specified")
		err = sa.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub.Name, AckIds: []string{"not an ack ID!"}, AckDeadlineSeconds: 10})
		wantStatus(t, "modack", err, codes.InvalidArgument, "Invalid ack id")
		err = sa.ModifyAckDeadline(ctx, &pb.ModifyAckDeadlineRequest{Subscription: sub.Name, AckDeadlineSeconds: 10})
		wantStatus(t, "modack of nothing", err, codes.InvalidArgument, "No ack ids specified")
		cases := map[string]*pb.StreamingPullRequest{
			"ack":             {AckIds: []string{"not an ack ID!"}},
			"modack":          {ModifyDeadlineAckIds: []string{"not an ack ID!"}, ModifyDeadlineSeconds: []int32{10}},
			"unpaired":        {ModifyDeadlineAckIds: []string{"1"}},
			"negative modack": {ModifyDeadlineAckIds: []string{"1"}, ModifyDeadlineSeconds: []int32{-1}},
		}
		if tg.ours != nil { // the emulator (528) keeps this stream open
			cases["flow control"] = &pb.StreamingPullRequest{MaxOutstandingMessages: 10}
		}
		for name, r := range cases {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			st, err := sa.StreamingPull(sctx)
			if err == nil {
				err = st.Send(&pb.StreamingPullRequest{Subscription: sub.Name, StreamAckDeadlineSeconds: 10})
			}
			if err == nil {
				err = st.Send(r)
			}
			for err == nil { // the broker answers the first request as a keepalive
				_, err = st.Recv()
			}
			wantStatus(t, "stream "+name, err, codes.InvalidArgument, "")
			cancel()
		}
	})
}

// TestPublishTooManyMessages: a publish request holds at most 1,000
// messages.
func TestPublishTooManyMessages(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		topic := createTopic(t, c)
		msgs := make([]*pb.PubsubMessage, 1001)
		for i := range msgs {
			msgs[i] = &pb.PubsubMessage{Data: []byte("x")}
		}
		_, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic, Messages: msgs})
		wantStatus(t, "1,001 messages", err, codes.InvalidArgument, "Too many messages to publish")
		r, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic, Messages: msgs[:1000]})
		if err != nil || len(r.MessageIds) != 1000 {
			t.Errorf("1,000 messages: %v", err)
		}
	})
}

// TestDetachedRefusesPull: Pull and StreamingPull on a detached
// subscription return FAILED_PRECONDITION, as the proto says, and a
// receiver already streaming when it is detached stops with that error.
// (Google's emulator does not implement DetachSubscription.)
func TestDetachedRefusesPull(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic})
	publish(t, c, topic, &pubsub.Message{Data: []byte("a")})
	got := make(chan string, 1)
	done := make(chan error, 1)
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	go func() {
		done <- c.Subscriber(sub.Name).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
			m.Ack()
			select {
			case got <- m.ID:
			default:
			}
		})
	}()
	<-got // the stream is open
	if _, err := c.TopicAdminClient.DetachSubscription(ctx, &pb.DetachSubscriptionRequest{Subscription: sub.Name}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "receive while detached", <-done, codes.FailedPrecondition, "detached")
	_, err := c.SubscriptionAdminClient.Pull(ctx, &pb.PullRequest{Subscription: sub.Name, MaxMessages: 1})
	wantStatus(t, "pull", err, codes.FailedPrecondition, "detached")
	err = c.Subscriber(sub.Name).Receive(rctx, func(context.Context, *pubsub.Message) {})
	wantStatus(t, "receive", err, codes.FailedPrecondition, "detached")
}

// TestLabelAndProjectRules: labels and project IDs follow the service's
// rules (package limits holds them); Google's emulator accepts anything.
func TestLabelAndProjectRules(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	_, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/P!/topics/orders"})
	wantStatus(t, "project P!", err, codes.InvalidArgument, "invalid project ID")
	_, err = c.TopicAdminClient.ListTopics(ctx, &pb.ListTopicsRequest{Project: "projects/P!"}).Next()
	wantStatus(t, "list in project P!", err, codes.InvalidArgument, "invalid project ID")
	_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), Labels: map[string]string{"Team": "shop"}})
	wantStatus(t, "upper-case label key", err, codes.InvalidArgument, "invalid label")
	topic := createTopic(t, c)
	_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic,
		Labels: map[string]string{"team": strings.Repeat("x", 64)}})
	wantStatus(t, "label value of 64 characters", err, codes.InvalidArgument, "invalid label")
	sub := createSub(t, c, &pb.Subscription{Topic: topic, Labels: map[string]string{"team": "shop", "équipe": "café"}})
	_, err = c.SubscriptionAdminClient.UpdateSubscription(ctx, &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, Labels: map[string]string{"1st": "x"}}, UpdateMask: mask("labels")})
	wantStatus(t, "label key starting with a digit", err, codes.InvalidArgument, "invalid label")
	_, err = c.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: "projects/" + project + "/snapshots/" + unique("n"),
		Subscription: sub.Name, Labels: map[string]string{"a.b": "x"}})
	wantStatus(t, "snapshot label with a dot", err, codes.InvalidArgument, "invalid label")
}

// TestCreateDefaults: what a create without settings returns, side by side
// with Google's emulator, and the fields only ours fills in as the service
// does (state, expiration) or drops (input-only tags).
func TestCreateDefaults(t *testing.T) {
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		c := newClient(t, tg.addr)
		ctx := context.Background()
		topic := createTopic(t, c)
		sub, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic})
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: sub.Name})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []*pb.Subscription{sub, got} {
			if s.AckDeadlineSeconds != 10 || s.MessageRetentionDuration.AsDuration() != 7*24*time.Hour || s.PushConfig == nil || s.PushConfig.PushEndpoint != "" {
				t.Errorf("defaults: %v", s)
			}
		}
		if tg.ours == nil {
			return
		}
		if got.State != pb.Subscription_ACTIVE || got.ExpirationPolicy.GetTtl().AsDuration() != 744*time.Hour {
			t.Errorf("state and expiration: %v", got)
		}
		tp, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), Tags: map[string]string{"123/env": "prod"}})
		if err != nil || tp.State != pb.Topic_ACTIVE || tp.Tags != nil {
			t.Errorf("topic with input-only tags: %v %v", tp, err)
		}
		_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic,
			BigtableConfig: &pb.BigtableConfig{Table: "projects/p/instances/i/tables/t"}})
		wantStatus(t, "bigtable subscription", err, codes.Unimplemented, "Bigtable")
	})
}

// TestKMSKeyName: kms_key_name must name a Cloud KMS key; the broker keeps
// it and encrypts nothing.
func TestKMSKeyName(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	ctx := context.Background()
	key := "projects/p/locations/europe-west1/keyRings/r/cryptoKeys/k"
	tp, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), KmsKeyName: key})
	if err != nil || tp.KmsKeyName != key {
		t.Fatalf("create with a key: %v %v", tp, err)
	}
	_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{Topic: &pb.Topic{Name: tp.Name, KmsKeyName: "my-key"}, UpdateMask: mask("kms_key_name")})
	wantStatus(t, "update to a bare key name", err, codes.InvalidArgument, "kms_key_name")
}

// TestRESTNestedMask: the REST API's camelCase updateMask takes dotted
// paths too, as gcloud and curl send them.
func TestRESTNestedMask(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	sub := createSub(t, c, &pb.Subscription{Topic: createTopic(t, c),
		PushConfig: &pb.PushConfig{PushEndpoint: "http://127.0.0.1:1/a", Attributes: map[string]string{"x-goog-version": "v1"}}})
	code, v := rest(t, "PATCH", "http://"+tg.addr+"/v1/"+sub.Name,
		`{"subscription":{"pushConfig":{"pushEndpoint":"http://127.0.0.1:1/b"}},"updateMask":"pushConfig.pushEndpoint"}`)
	pc, _ := v["pushConfig"].(map[string]any)
	if code != 200 || pc["pushEndpoint"] != "http://127.0.0.1:1/b" || pc["attributes"] == nil {
		t.Errorf("PATCH with pushConfig.pushEndpoint: %d %v", code, v)
	}
}
