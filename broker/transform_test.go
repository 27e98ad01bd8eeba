package broker

//lint:file-ignore SA1019 the tests pull with ReturnImmediately, deprecated in the API yet still honoured by the service, to see an empty backlog at once

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	gax "github.com/googleapis/gax-go/v2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

const (
	udfUpper = `function up(message, metadata) {
  message.data = message.data.toUpperCase();
  message.attributes["transformed"] = "yes";
  return message;
}`
	udfDrop  = `function drop(message) { return message.attributes.drop === "yes" ? null : message; }`
	udfThrow = `function boom(message) { throw new Error("no " + message.data); }`
	udfSpin  = `function spin(message) { while (true) {} }`
)

func jsTransform(name, code string) *pb.MessageTransform {
	return &pb.MessageTransform{Transform: &pb.MessageTransform_JavascriptUdf{
		JavascriptUdf: &pb.JavaScriptUDF{FunctionName: name, Code: code}}}
}

func createTopicWith(t *testing.T, c *pubsub.Client, ts ...*pb.MessageTransform) string {
	t.Helper()
	tp, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topicName(unique("t")), MessageTransforms: ts})
	if err != nil {
		t.Fatal(err)
	}
	return tp.Name
}

func TestTransformTopicUpperCase(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	topic := createTopicWith(t, c, jsTransform("up", udfUpper))
	sub := createSub(t, c, &pb.Subscription{Topic: topic})
	publish(t, c, topic, &pubsub.Message{Data: []byte("hello"), Attributes: map[string]string{"k": "v"}})
	m := pullOne(t, c, sub.Name, 5*time.Second).Message
	if string(m.Data) != "HELLO" || m.Attributes["transformed"] != "yes" || m.Attributes["k"] != "v" {
		t.Errorf("got %q %v, want HELLO with k=v and transformed=yes", m.Data, m.Attributes)
	}
}

func TestTransformTopicNullDrops(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	topic := createTopicWith(t, c, jsTransform("drop", udfDrop))
	sub := createSub(t, c, &pb.Subscription{Topic: topic})
	ids := publishPB(t, c, topic,
		&pb.PubsubMessage{Data: []byte("gone"), Attributes: map[string]string{"drop": "yes"}},
		&pb.PubsubMessage{Data: []byte("kept")})
	if len(ids) != 2 || ids[0] == "" || ids[0] == ids[1] {
		t.Fatalf("message IDs %v, want two distinct IDs, the filtered one included", ids)
	}
	m := pullOne(t, c, sub.Name, 5*time.Second).Message
	if string(m.Data) != "kept" || m.MessageId != ids[1] {
		t.Errorf("got %q (%s), want kept (%s)", m.Data, m.MessageId, ids[1])
	}
	r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub.Name, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
	if err != nil || len(r.ReceivedMessages) != 0 {
		t.Errorf("after the kept message: %v %v, want nothing", r, err)
	}
	if n := tg.ours.topics[topic].transforms.list[0].filtered.Load(); n != 1 {
		t.Errorf("filtered count %d, want 1", n)
	}
}

// TestTransformSubscriptionOnly: a subscription's transform changes what
// that subscription delivers, through streaming pull, and not what another
// subscription of the same topic delivers.
func TestTransformSubscriptionOnly(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	withUDF := createSub(t, c, &pb.Subscription{Topic: topic, MessageTransforms: []*pb.MessageTransform{jsTransform("up", udfUpper)}})
	plain := createSub(t, c, &pb.Subscription{Topic: topic})
	publish(t, c, topic, &pubsub.Message{Data: []byte("hello")})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got *pubsub.Message
	err := c.Subscriber(withUDF.Name).Receive(ctx, func(_ context.Context, m *pubsub.Message) {
		m.Ack()
		got = m
		cancel()
	})
	if err != nil || got == nil {
		t.Fatalf("receive: %v, got %v", err, got)
	}
	if string(got.Data) != "HELLO" || got.Attributes["transformed"] != "yes" {
		t.Errorf("streaming pull with the UDF got %q %v", got.Data, got.Attributes)
	}
	if m := pullOne(t, c, plain.Name, 5*time.Second).Message; string(m.Data) != "hello" || len(m.Attributes) != 0 {
		t.Errorf("the other subscription got %q %v, want it untouched", m.Data, m.Attributes)
	}
}

func TestTransformThrows(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	t.Run("topic", func(t *testing.T) {
		topic := createTopicWith(t, c, jsTransform("boom", udfThrow))
		sub := createSub(t, c, &pb.Subscription{Topic: topic})
		_, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic,
			Messages: []*pb.PubsubMessage{{Data: []byte("x")}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "no x") {
			t.Fatalf("publish: %v, want InvalidArgument with the thrown error", err)
		}
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub.Name, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
		if err != nil || len(r.ReceivedMessages) != 0 {
			t.Errorf("a failed publish stored %v (%v)", r, err)
		}
	})
	t.Run("subscription", func(t *testing.T) {
		topic, dl := createTopic(t, c), createTopic(t, c)
		dlSub := createSub(t, c, &pb.Subscription{Topic: dl})
		sub := createSub(t, c, &pb.Subscription{Topic: topic, MessageTransforms: []*pb.MessageTransform{jsTransform("boom", udfThrow)},
			DeadLetterPolicy: &pb.DeadLetterPolicy{DeadLetterTopic: dl, MaxDeliveryAttempts: 5}})
		publish(t, c, topic, &pubsub.Message{Data: []byte("x")})
		r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub.Name, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
		if err != nil || len(r.ReceivedMessages) != 0 {
			t.Errorf("the failed message was delivered: %v (%v)", r, err)
		}
		m := pullOne(t, c, dlSub.Name, 5*time.Second).Message
		if string(m.Data) != "x" || m.Attributes[attrDLSubscription] == "" {
			t.Errorf("dead-lettered %q %v, want the original message", m.Data, m.Attributes)
		}
		if n := tg.ours.subs[sub.Name].transforms.list[0].failed.Load(); n != 1 {
			t.Errorf("failed count %d, want 1", n)
		}
	})
}

func TestTransformRunsTooLong(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	topic := createTopicWith(t, c, jsTransform("spin", udfSpin))
	// Without the client's retries: DEADLINE_EXCEEDED is one it retries.
	_, err := c.TopicAdminClient.Publish(context.Background(), &pb.PublishRequest{Topic: topic,
		Messages: []*pb.PubsubMessage{{Data: []byte("x")}}}, gax.WithRetry(func() gax.Retryer { return nil }))
	if status.Code(err) != codes.DeadlineExceeded || !strings.Contains(err.Error(), "ran longer than 500ms") {
		t.Fatalf("publish: %v, want DeadlineExceeded saying it ran too long", err)
	}
	// The broker still serves the topic's other publishes.
	if _, err := c.TopicAdminClient.GetTopic(context.Background(), &pb.GetTopicRequest{Topic: topic}); err != nil {
		t.Fatal(err)
	}
}

func TestTransformInvalidCodeRefused(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	ctx := context.Background()
	for _, tc := range []struct {
		tr   *pb.MessageTransform
		want string
	}{
		{jsTransform("f", "function f(m) { return m;"), "does not parse"},
		{jsTransform("g", "function f(m) { return m; }"), `no function named "g"`},
		{jsTransform("", "function f(m) { return m; }"), "function_name is empty"},
		{&pb.MessageTransform{}, "only javascript_udf"},
		{nil, "6 are enabled, at most 5"},
	} {
		trs := []*pb.MessageTransform{tc.tr}
		if tc.tr == nil {
			trs = nil
			for range 6 {
				trs = append(trs, jsTransform("up", udfUpper))
			}
			off := jsTransform("up", udfUpper)
			off.Disabled = true
			ok := append([]*pb.MessageTransform{off}, trs[:5]...)
			if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), MessageTransforms: ok}); err != nil {
				t.Errorf("five enabled and one disabled: %v", err)
			}
		}
		_, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("t")), MessageTransforms: trs})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create topic: %v, want InvalidArgument with %q", err, tc.want)
		}
		topic := createTopic(t, c)
		_, err = c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{Name: subName(unique("s")), Topic: topic,
			MessageTransforms: trs})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("create subscription: %v, want InvalidArgument with %q", err, tc.want)
		}
		_, err = c.TopicAdminClient.UpdateTopic(ctx, &pb.UpdateTopicRequest{
			Topic:      &pb.Topic{Name: topic, MessageTransforms: trs},
			UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"message_transforms"}}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("update topic: %v, want InvalidArgument with %q", err, tc.want)
		}
	}
}

func TestTransformDisabled(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	off := jsTransform("up", udfUpper)
	off.Disabled = true
	topic := createTopicWith(t, c, off)
	sub := createSub(t, c, &pb.Subscription{Topic: topic})
	publish(t, c, topic, &pubsub.Message{Data: []byte("hello")})
	if m := pullOne(t, c, sub.Name, 5*time.Second).Message; string(m.Data) != "hello" {
		t.Errorf("disabled transform ran: %q", m.Data)
	}
	// Enabled again by an update, it runs.
	_, err := c.TopicAdminClient.UpdateTopic(context.Background(), &pb.UpdateTopicRequest{
		Topic:      &pb.Topic{Name: topic, MessageTransforms: []*pb.MessageTransform{jsTransform("up", udfUpper)}},
		UpdateMask: &fieldmaskpb.FieldMask{Paths: []string{"message_transforms"}}})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, c, topic, &pubsub.Message{Data: []byte("again")})
	for {
		m := pullOne(t, c, sub.Name, 5*time.Second)
		if string(m.Message.Data) == "AGAIN" {
			break
		}
		if string(m.Message.Data) != "hello" {
			t.Fatalf("after enabling: %q, want AGAIN", m.Message.Data)
		}
	}
}

func TestTransformPushBody(t *testing.T) {
	tg := startOurs(t, realClock)
	c := newClient(t, tg.addr)
	e := newEndpoint(t, always(http.StatusOK))
	topic := createTopic(t, c)
	drop := jsTransform("drop", udfDrop)
	pushSub(t, tg, c, &pb.Subscription{Topic: topic, PushConfig: &pb.PushConfig{PushEndpoint: e.URL},
		MessageTransforms: []*pb.MessageTransform{drop, jsTransform("up", udfUpper)}})
	publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("gone"), Attributes: map[string]string{"drop": "yes"}},
		&pb.PubsubMessage{Data: []byte("pushed")})
	w := decodeWrapped(t, e.next(t, 10*time.Second))
	if string(w.Message.Data) != "PUSHED" || w.Message.Attributes["transformed"] != "yes" {
		t.Errorf("push body %q %v, want PUSHED with transformed=yes", w.Message.Data, w.Message.Attributes)
	}
	select {
	case p := <-e.got:
		t.Errorf("a second push, of a filtered message: %s", p.body)
	case <-time.After(300 * time.Millisecond):
	}
}

// TestTransformRestart: transforms are fields of the topic and the
// subscription, so they come back from --data-dir, after compaction too.
func TestTransformRestart(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, Now: time.Now}
	tg := startOurs(t, opts)
	c := newClient(t, tg.addr)
	topic := createTopicWith(t, c, jsTransform("drop", udfDrop))
	sub := createSub(t, c, &pb.Subscription{Topic: topic, MessageTransforms: []*pb.MessageTransform{jsTransform("up", udfUpper)}})
	if err := tg.ours.compact(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := tg.ours.Close(); err != nil {
		t.Fatal(err)
	}
	tg2 := startOurs(t, opts)
	c2 := newClient(t, tg2.addr)
	publishPB(t, c2, topic, &pb.PubsubMessage{Data: []byte("gone"), Attributes: map[string]string{"drop": "yes"}},
		&pb.PubsubMessage{Data: []byte("after restart")})
	if m := pullOne(t, c2, sub.Name, 5*time.Second).Message; string(m.Data) != "AFTER RESTART" {
		t.Errorf("after restart got %q, want AFTER RESTART", m.Data)
	}
	got, err := c2.SubscriptionAdminClient.GetSubscription(context.Background(), &pb.GetSubscriptionRequest{Subscription: sub.Name})
	if err != nil || len(got.MessageTransforms) != 1 || got.MessageTransforms[0].GetJavascriptUdf().FunctionName != "up" {
		t.Errorf("subscription after restart: %v %v", got.GetMessageTransforms(), err)
	}
}

// TestTransformFailureKeepsMessage: without a dead-letter topic, a message
// that fails a subscription's transform is not lost: once the UDF is fixed,
// it is delivered after its ack deadline, transformed by the new code.
func TestTransformFailureKeepsMessage(t *testing.T) {
	tg := startOurs(t, Options{})
	c := newClient(t, tg.addr)
	topic := createTopic(t, c)
	sub := createSub(t, c, &pb.Subscription{Topic: topic, AckDeadlineSeconds: 10,
		MessageTransforms: []*pb.MessageTransform{jsTransform("boom", udfThrow)}})
	publish(t, c, topic, &pubsub.Message{Data: []byte("kept")})
	r, err := c.SubscriptionAdminClient.Pull(context.Background(), &pb.PullRequest{Subscription: sub.Name, MaxMessages: 10, ReturnImmediately: true}) //nolint:staticcheck
	if err != nil || len(r.ReceivedMessages) != 0 {
		t.Fatalf("the failed message was delivered: %v (%v)", r, err)
	}
	if _, err := c.SubscriptionAdminClient.UpdateSubscription(context.Background(), &pb.UpdateSubscriptionRequest{
		Subscription: &pb.Subscription{Name: sub.Name, MessageTransforms: []*pb.MessageTransform{jsTransform("up", udfUpper)}},
		UpdateMask:   &fieldmaskpb.FieldMask{Paths: []string{"message_transforms"}}}); err != nil {
		t.Fatal(err)
	}
	tg.clock.Advance(11 * time.Second)
	if m := pullOne(t, c, sub.Name, 5*time.Second).Message; string(m.Data) != "KEPT" {
		t.Errorf("after the fix got %q, want KEPT", m.Data)
	}
}

// TestTransformCallsRefuse: the REST transform calls name what is wrong
// with a request, with the service's codes.
func TestTransformCallsRefuse(t *testing.T) {
	base := "http://" + startOurs(t, Options{}).addr + "/v1/projects/"
	udf, _ := json.Marshal(map[string]any{"javascriptUdf": map[string]string{"functionName": "up", "code": udfUpper}})
	msg := `"message":{"data":"aGk="}`
	for _, tc := range []struct {
		name, method, path, body string
		code                     int
		status, msg              string
	}{
		{"validate without a transform", "POST", project + ":validateMessageTransform", `{}`, 400, "INVALID_ARGUMENT", "message_transform is required"},
		{"validate, unknown field", "POST", project + ":validateMessageTransform", `{"transform":{}}`, 400, "INVALID_ARGUMENT", `unknown name "transform"`},
		{"validate, not JSON", "POST", project + ":validateMessageTransform", `{`, 400, "INVALID_ARGUMENT", "invalid JSON payload"},
		{"validate, no UDF", "POST", project + ":validateMessageTransform", `{"messageTransform":{}}`, 400, "INVALID_ARGUMENT", "only javascript_udf"},
		{"test without a message", "POST", project + ":testMessageTransforms", `{"topic":"projects/` + project + `/topics/abc"}`, 400, "INVALID_ARGUMENT", "message is required"},
		{"test, empty message", "POST", project + ":testMessageTransforms", `{"message":{},"messageTransforms":{"messageTransforms":[` + string(udf) + `]}}`, 400, "INVALID_ARGUMENT", "data or at least one attribute"},
		{"test without transforms", "POST", project + ":testMessageTransforms", `{` + msg + `}`, 400, "INVALID_ARGUMENT", "exactly one of"},
		{"test, two sources", "POST", project + ":testMessageTransforms", `{` + msg + `,"topic":"projects/` + project + `/topics/abc","subscription":"projects/` + project + `/subscriptions/abc"}`, 400, "INVALID_ARGUMENT", "exactly one of"},
		{"test, no such subscription", "POST", project + ":testMessageTransforms", `{` + msg + `,"subscription":"projects/` + project + `/subscriptions/none-here"}`, 404, "NOT_FOUND", "subscription not found"},
		{"test, bad topic name", "POST", project + ":testMessageTransforms", `{` + msg + `,"topic":"abc"}`, 400, "INVALID_ARGUMENT", "invalid topic name"},
		{"wrong method", "GET", project + ":testMessageTransforms", ``, 404, "NOT_FOUND", "this path takes POST"},
		{"bad project", "POST", "9p:validateMessageTransform", `{}`, 400, "INVALID_ARGUMENT", `invalid project "9p"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, v := rest(t, tc.method, base+tc.path, tc.body)
			e, _ := v["error"].(map[string]any)
			if code != tc.code || e["status"] != tc.status || !strings.Contains(fmt.Sprint(e["message"]), tc.msg) {
				t.Fatalf("got %d %v, want %d %s with a message containing %q", code, v, tc.code, tc.status, tc.msg)
			}
		})
	}
}

// TestTransformFilteredIDKept: the ID a publisher got for a message a topic
// transform filtered out is not given to another message after a restart
// (without compaction in between), so message IDs stay unique on a topic.
func TestTransformFilteredIDKept(t *testing.T) {
	dir := t.TempDir()
	opts := Options{DataDir: dir, Now: time.Now}
	tg := startOurs(t, opts)
	c := newClient(t, tg.addr)
	topic := createTopicWith(t, c, jsTransform("drop", udfDrop))
	filtered := publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("gone"), Attributes: map[string]string{"drop": "yes"}})[0]
	c.Close()
	if err := tg.ours.Close(); err != nil {
		t.Fatal(err)
	}
	tg2 := startOurs(t, opts)
	c2 := newClient(t, tg2.addr)
	if next := publishPB(t, c2, topic, &pb.PubsubMessage{Data: []byte("kept")})[0]; next == filtered {
		t.Fatalf("the message after the restart got ID %s, the filtered message's", next)
	}
}
