package main

import (
	"context"
	"flag"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// Beam's option names become dedupflow's flags; the Beam options dedupflow
// does not take are refused with what to do instead.
func TestBeamArgs(t *testing.T) {
	for _, tc := range []struct {
		args, want []string
		notice     string
		err        string
	}{
		{args: []string{"--project=p", "--inputTopic=projects/p/topics/in", "--outputTopic=projects/p/topics/out", "--idAttribute=key", "--runner=DataflowRunner"},
			want:   []string{"--project=p", "--input-topic=projects/p/topics/in", "--output-topic=projects/p/topics/out", "--id-attribute=key"},
			notice: "--runner=DataflowRunner is not needed: dedupflow is the runner"},
		{args: []string{"--inputSubscription=s", "--timestampAttribute=ts", "-idAttribute=k"},
			want: []string{"--input-subscription=s", "--timestamp-attribute=ts", "-id-attribute=k"}},
		// The value of a flag is never read as a flag, nor is what follows --.
		{args: []string{"--id-attribute", "--streaming", "--shadow", "--outputTopic", "t", "--", "--region=x"},
			want: []string{"--id-attribute", "--streaming", "--shadow", "--output-topic", "t", "--", "--region=x"}},
		{args: []string{"--runner", "DirectRunner", "--horizon=1m"}, want: []string{"--horizon=1m"}, notice: "--runner=DirectRunner"},
		{args: []string{"--streaming"}, err: "--streaming is a Beam option that dedupflow does not take: dedupflow always streams"},
		{args: []string{"--tempLocation=gs://b/tmp"}, err: "--tempLocation is a Beam option that dedupflow does not take: dedupflow runs the pipeline in this process"},
		{args: []string{"--stagingLocation=gs://b/st"}, err: "leave it out"},
		{args: []string{"--region=europe-west1"}, err: "--region is a Beam option"},
		{args: []string{"--jobName=dedup"}, err: "--jobName is a Beam option"},
		{args: []string{"--numWorkers=3"}, err: "run more dedupflow pipeline replicas on one subscription, sharing --state redis://"},
		{args: []string{"--maxNumWorkers=10"}, err: "replicas"},
		{args: []string{"--outputDeadletterTopic=dl"}, err: "use --dead-letter-topic"},
		{args: []string{"--deadLetterTopic=dl"}, err: "unknown flag --deadLetterTopic: use --dead-letter-topic"},
		{args: []string{"--maxOutstanding=10"}, err: "use --max-outstanding"},
		{args: []string{"--windowSize=5"}, err: "--windowSize looks like a Beam option, and dedupflow does not take it"},
		// Not Beam's: left to the flag package.
		{args: []string{"--nosuch"}, want: []string{"--nosuch"}},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var j jobFlags
			fs := flag.NewFlagSet("pipeline", flag.ContinueOnError)
			j.register(fs)
			got, notice, err := beamArgs(fs, tc.args)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) || !strings.Contains(notice, tc.notice) || (tc.notice == "") != (notice == "") {
				t.Fatalf("got %q, notice %q, %v; want %q, notice %q", got, notice, err, tc.want, tc.notice)
			}
		})
	}
	// Through the command: refused before anything connects.
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	err := run(context.Background(), []string{"pipeline", "--project=p", "--inputTopic=in-topic", "--outputTopic=out-topic", "--numWorkers=2"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--numWorkers is a Beam option") {
		t.Fatalf("pipeline --numWorkers=2: %v", err)
	}
}

// TestTutorialDataflowCommand runs the tutorial's Dataflow command line,
// unchanged, against the test broker: the copies of a republished event
// collapse into one, as they do on Dataflow.
func TestTutorialDataflowCommand(t *testing.T) {
	const project = "tutorial-project" // $PROJECT_NAME
	_, c := startBroker(t, project)
	ctx := context.Background()
	for _, id := range []string{"topicToDataflow", "topicFromDataflow"} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/" + project + "/topics/" + id}); err != nil {
			t.Fatal(err)
		}
	}
	outSub := "projects/" + project + "/subscriptions/subscriptionFromDataflow"
	if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pb.Subscription{
		Name: outSub, Topic: "projects/" + project + "/topics/topicFromDataflow", AckDeadlineSeconds: 10,
	}); err != nil {
		t.Fatal(err)
	}
	// The metrics address comes from the environment, so that the command
	// line stays the tutorial's.
	metricsAddr := freeAddr(t)
	t.Setenv("DEDUPFLOW_METRICS_ADDR", metricsAddr)

	cmdline := "--project=$PROJECT_NAME --inputTopic=projects/$PROJECT_NAME/topics/topicToDataflow " +
		"--outputTopic=projects/$PROJECT_NAME/topics/topicFromDataflow --idAttribute=key --runner=DataflowRunner"
	args := append([]string{"pipeline"}, strings.Fields(strings.ReplaceAll(cmdline, "$PROJECT_NAME", project))...)
	var stdout, stderr testenv.Buffer
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		done <- run(pctx, args, &stdout, &stderr)
		close(exited)
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pipeline: %v\n%s", err, &stderr)
		}
	}()
	waitFor(t, "start line", &stderr, &stdout, regexp.MustCompile(`(?m)^(.*msg="pipeline running".*)$`), exited)
	if !strings.Contains(stderr.String(), "dedupflow is the runner") {
		t.Errorf("no notice about --runner:\n%s", &stderr)
	}

	// The tutorial's publisher: event 123 sent three times (a retry after
	// each lost response), event 456 once.
	pub := c.Publisher("projects/" + project + "/topics/topicToDataflow")
	for _, k := range []string{"123", "123", "456", "123"} {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("Message " + k), Attributes: map[string]string{"key": k}}).Get(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pub.Stop()
	url := "http://" + metricsAddr + "/metrics"
	var m map[string]float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m = scrapeOutcomes(t, url); m["emitted"]+m["duplicate_republish"] >= 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the pipeline settled fewer than 4 messages in 30s: %v\n%s", m, &stderr)
		}
	}
	if m["emitted"] != 2 || m["duplicate_republish"] != 2 {
		t.Errorf("emitted %v and republishes %v, want 2 and 2: %v", m["emitted"], m["duplicate_republish"], m)
	}
	// The tutorial's consumer app sees each event once.
	rctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	var (
		mu  sync.Mutex
		got []string
	)
	err := c.Subscriber(outSub).Receive(rctx, func(_ context.Context, msg *pubsub.Message) {
		msg.Ack()
		mu.Lock()
		defer mu.Unlock()
		got = append(got, msg.Attributes["key"]+"="+string(msg.Data))
		if len(got) == 2 {
			stop()
		}
	})
	if err != nil && rctx.Err() == nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	slices.Sort(got)
	if !slices.Equal(got, []string{"123=Message 123", "456=Message 456"}) {
		t.Fatalf("the consumer got %q, want each event once", got)
	}
}
