package examples

import (
	"context"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

var (
	reTomcat   = regexp.MustCompile(`Tomcat started on port(?:\(s\):)? (\d+)`) // Spring Boot 3, and 2 with "(s):"
	reReceived = regexp.MustCompile(`(?m)^received ".*$`)
)

// TestSpringTutorialApp does what the tutorial's reader does: it starts
// `dedupflow up` and the tutorial's Spring Cloud Stream app pointed at it
// by the emulator host alone, sends Message 1 with key 123 and Messages 2,
// 3 and 4 with key 456 through the app's web form, and sees the app's
// consumer print Message 1 and Message 2 only, while the console counts
// the two republishes.
//
// It runs the app twice: on Spring Boot 3 with the binder of today, and on
// the tutorial's Spring Boot 2.2.4 with the last 1.2.x of its binder.
func TestSpringTutorialApp(t *testing.T) {
	java := testenv.Tool(t, "java")
	bin := buildDedupflow(t)
	t.Run("boot3", func(t *testing.T) { runSpringTutorial(t, java, testenv.SpringTutorialJar(t), bin) })
	t.Run("boot2.2", func(t *testing.T) { runSpringTutorial(t, java, testenv.SpringTutorial2020Jar(t), bin) })
}

func runSpringTutorial(t *testing.T, java, jar, bin string) {
	up := start(t, nil, bin, "up", "--broker-addr", "127.0.0.1:0", "--console-addr", "127.0.0.1:0",
		"--metrics-addr", "127.0.0.1:0")
	broker := up.waitFor(t, reEmulator, 30*time.Second)
	console := up.waitFor(t, reConsole, 30*time.Second)

	app := start(t, nil, java, "-jar", jar,
		"--spring.cloud.gcp.pubsub.emulator-host="+broker, "--server.port=0")
	form := "http://127.0.0.1:" + app.waitFor(t, reTomcat, 3*time.Minute) + "/"
	app.waitFor(t, regexp.MustCompile(`(Started App) in`), time.Minute)

	// Each message is posted once the pipeline has decided the one before,
	// as a reader types them: Message 2 is the first of key 456 it sees,
	// not whichever of 2, 3 and 4 the app's publisher happened to send first.
	var got consoleCounts
	for i, m := range []struct{ message, key string }{
		{"Message 1", "123"}, {"Message 2", "456"}, {"Message 3", "456"}, {"Message 4", "456"},
	} {
		resp, err := http.PostForm(form, url.Values{"message": {m.message}, "key": {m.key}})
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("posting %q to the form: %s", m.message, resp.Status)
		}
		got = waitCounts(t, console, time.Minute, func(c consoleCounts) bool {
			n := int64(i + 1)
			return c.Received == n && c.Emitted+c.Republish == n
		})
	}
	if got.Emitted != 2 || got.Republish != 2 || got.Redelivery != 0 {
		t.Errorf("console counts %+v, want 4 received, 2 emitted, 2 republishes", got)
	}
	// The pipeline emitted two; the app prints what it receives.
	app.waitFor(t, regexp.MustCompile(`(?s)(received.*received)`), time.Minute)
	printed := reReceived.FindAllString(app.out.String(), -1)
	slices.Sort(printed)
	if want := []string{`received "Message 1" key=123`, `received "Message 2" key=456`}; !slices.Equal(printed, want) {
		t.Errorf("the app printed %q, want %q", printed, want)
	}

	// A JVM stopped by SIGTERM runs its shutdown hooks and exits 143.
	if code := app.stop(t, syscall.SIGTERM); code != 143 {
		t.Errorf("the app exited %d after SIGTERM, want 143:\n%s", code, app.out.String())
	}
	if code := up.stop(t, syscall.SIGINT); code != 0 {
		t.Errorf("dedupflow up exited %d after Ctrl-C, want 0:\n%s", code, up.out.String())
	}
	if s := app.out.String(); strings.Contains(s, " ERROR ") {
		t.Errorf("the app logged an error:\n%s", s)
	}
}

// TestSpringTutorialAppCreatesItsTopics starts the app against a broker
// that has nothing yet: the binder creates both topics and the consumer's
// subscription, so the app does not depend on `up` making them first.
func TestSpringTutorialAppCreatesItsTopics(t *testing.T) {
	java := testenv.Tool(t, "java")
	jar := testenv.SpringTutorialJar(t)
	bin := buildDedupflow(t)
	broker := start(t, nil, bin, "broker", "--listen", "127.0.0.1:0")
	addr := broker.waitFor(t, reEmulator, 30*time.Second)
	app := start(t, nil, java, "-jar", jar, "--spring.cloud.gcp.pubsub.emulator-host="+addr, "--server.port=0")
	app.waitFor(t, regexp.MustCompile(`(Started App) in`), 3*time.Minute)

	c := client(t, "dedupflow-demo", addr)
	ctx := context.Background()
	for _, topic := range []string{"topicToDataflow", "topicFromDataflow"} {
		if _, err := c.TopicAdminClient.GetTopic(ctx, &pb.GetTopicRequest{Topic: "projects/dedupflow-demo/topics/" + topic}); err != nil {
			t.Errorf("topic %s: %v", topic, err)
		}
	}
	sub, err := c.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{
		Subscription: "projects/dedupflow-demo/subscriptions/topicFromDataflow.subscriptionFromDataflow"})
	if err != nil {
		t.Fatalf("the consumer's subscription: %v", err)
	}
	if want := "projects/dedupflow-demo/topics/topicFromDataflow"; sub.Topic != want {
		t.Errorf("the consumer's subscription is on %s, want %s", sub.Topic, want)
	}
	if code := app.stop(t, syscall.SIGTERM); code != 143 {
		t.Errorf("the app exited %d after SIGTERM, want 143", code)
	}
	if code := broker.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("dedupflow broker exited %d after SIGTERM", code)
	}
}
