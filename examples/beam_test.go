package examples

import (
	"context"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// beamProject is the project of the side-by-side run; Beam wants 6 to 30
// characters.
const beamProject = "dedupflow-demo"

func topicPath(id string) string { return "projects/" + beamProject + "/topics/" + id }

// sideBySide is one broker with Beam's pipeline and dedupflow's reading the
// same input topic, each through its own subscription, to outputs of their
// own.
type sideBySide struct {
	c                *pubsub.Client
	broker           *proc
	in               *pubsub.Publisher
	beam, dedupflow  *proc
	beamOut, dfOut   *output
	dfDeadLetter     *output
	inputSubs, snaps []string
}

// startSideBySide starts the broker, both pipelines with the tutorial's
// options (plus a timestamp attribute), and waits for both input
// subscriptions, which it snapshots before anything is published.
func startSideBySide(t *testing.T) *sideBySide {
	jar := testenv.BeamReferenceJar(t)
	java := testenv.Tool(t, "java")
	bin := buildDedupflow(t)
	broker := start(t, nil, bin, "broker", "--listen", "127.0.0.1:0", "--project", beamProject,
		"--topic", "tutorial-in", "--topic", "beam-out", "--topic", "dedupflow-out", "--topic", "dedupflow-dl",
		"--subscription", "beam-out:beam-check", "--subscription", "dedupflow-out:dedupflow-check",
		"--subscription", "dedupflow-dl:dedupflow-dl-check")
	addr := broker.waitFor(t, reEmulator, 30*time.Second)
	s := &sideBySide{c: client(t, beamProject, addr), broker: broker}
	s.in = s.c.Publisher("tutorial-in")
	t.Cleanup(s.in.Stop)

	// The same options, in Beam's form, for both.
	common := []string{"--inputTopic=" + topicPath("tutorial-in"), "--idAttribute=key", "--timestampAttribute=ts"}
	s.beam = start(t, nil, java, append([]string{"-jar", jar,
		"--pubsubRootUrl=http://" + addr, "--project=" + beamProject,
		"--credentialFactoryClass=org.apache.beam.sdk.extensions.gcp.auth.NoopCredentialFactory",
		"--outputTopic=" + topicPath("beam-out")}, common...)...)
	s.dedupflow = start(t, []string{"PUBSUB_EMULATOR_HOST=" + addr}, bin, append([]string{"pipeline",
		"--project=" + beamProject, "--outputTopic=" + topicPath("dedupflow-out"),
		"--dead-letter-topic=dedupflow-dl", "--metrics-addr=127.0.0.1:0"}, common...)...)
	s.beamOut = collect(t, s.c, "beam-check")
	s.dfOut = collect(t, s.c, "dedupflow-check")
	s.dfDeadLetter = collect(t, s.c, "dedupflow-dl-check")

	deadline := time.Now().Add(2 * time.Minute)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		s.inputSubs = s.listInputSubs(t)
		if len(s.inputSubs) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("input subscriptions after 2 min: %q\nbeam:\n%s\ndedupflow:\n%s",
				s.inputSubs, s.beam.out.String(), s.dedupflow.out.String())
		}
		<-tick.C
	}
	for i, sub := range s.inputSubs {
		snap := "projects/" + beamProject + "/snapshots/before-" + strconv.Itoa(i)
		if _, err := s.c.SubscriptionAdminClient.CreateSnapshot(context.Background(),
			&pb.CreateSnapshotRequest{Name: snap, Subscription: sub}); err != nil {
			t.Fatal(err)
		}
		s.snaps = append(s.snaps, snap)
	}
	return s
}

// listInputSubs lists the subscriptions of the input topic.
func (s *sideBySide) listInputSubs(t *testing.T) []string {
	t.Helper()
	var subs []string
	it := s.c.TopicAdminClient.ListTopicSubscriptions(context.Background(),
		&pb.ListTopicSubscriptionsRequest{Topic: topicPath("tutorial-in")})
	for {
		name, err := it.Next()
		if err == iterator.Done {
			return subs
		}
		if err != nil {
			t.Fatal(err)
		}
		subs = append(subs, name)
	}
}

// publish sends one message to the input topic and returns its ID.
func (s *sideBySide) publish(t *testing.T, data string, attrs map[string]string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := s.in.Publish(ctx, &pubsub.Message{Data: []byte(data), Attributes: attrs}).Get(ctx)
	if err != nil {
		t.Fatalf("publish %q: %v", data, err)
	}
	return id
}

// barrier returns once both pipelines have read all input published before
// it, and written what they emit of it. It publishes name and, once both
// outputs carry it, name+", later", each with a key of its own, and waits
// for that too: Beam's sink writes in panes by shard, fired up to a couple
// of seconds after their first element, so something Beam read just
// before name may be written after name, but not after a message it read
// only once name was out.
func (s *sideBySide) barrier(t *testing.T, name string) []string {
	t.Helper()
	fence := []string{name, name + ", later"}
	for _, data := range fence {
		s.publish(t, data, map[string]string{"key": data, "ts": strconv.FormatInt(time.Now().UnixMilli(), 10)})
		s.beamOut.wait(t, "Beam", data, 2*time.Minute)
		s.dfOut.wait(t, "dedupflow", data, 2*time.Minute)
	}
	return fence
}

// copies names the messages of one key in the input, of which a pipeline
// emits one, but which is not fixed: Beam's DirectRunner reads a
// subscription through several concurrent readers, so any copy may be the
// first it sees.
var copies = map[string]string{
	"Message 2": "one of Message 2, 3, 4", "Message 3": "one of Message 2, 3, 4", "Message 4": "one of Message 2, 3, 4",
}

// beamCopies adds, for Beam, the keyless message and the event whose key
// is that message's ID: the same record ID to Beam.
var beamCopies = map[string]string{
	"Message 2": "one of Message 2, 3, 4", "Message 3": "one of Message 2, 3, 4", "Message 4": "one of Message 2, 3, 4",
	"keyless": "one of keyless, key equals an ID", "key equals an ID": "one of keyless, key equals an ID",
}

// byKey sorts payloads with the copies of one key under one name.
func byKey(data []string, copies map[string]string) []string {
	out := make([]string, len(data))
	for i, d := range data {
		if name, ok := copies[d]; ok {
			d = name
		}
		out[i] = d
	}
	slices.Sort(out)
	return out
}

var reBadTimestamp = regexp.MustCompile(`(NumberFormatException: Invalid date/time format: yesterday)`)

// TestBeamReferenceSideBySide feeds one input to Beam's PubsubIO on the
// DirectRunner and to dedupflow pipeline, with the tutorial's options, and
// compares what each writes: the tutorial's messages, republishes, keyless
// messages, a timestamp attribute in both forms and a seek back agree; a
// key equal to a keyless message's ID, the output's attributes and a bad
// timestamp differ on purpose (docs/tutorial.md, "Beam's PubsubIO, side by side").
func TestBeamReferenceSideBySide(t *testing.T) {
	s := startSideBySide(t)
	now := time.Now()
	millis := strconv.FormatInt(now.UnixMilli(), 10)
	rfc3339 := now.UTC().Format(time.RFC3339Nano)
	offset := now.In(time.FixedZone("", 2*3600)).Format(time.RFC3339)

	// The tutorial's messages (Message 3 and 4 republish Message 2's key),
	// with the event time in each form Beam reads.
	s.publish(t, "Message 1", map[string]string{"key": "123", "ts": millis})
	s.publish(t, "Message 2", map[string]string{"key": "456", "ts": rfc3339})
	s.publish(t, "Message 3", map[string]string{"key": "456", "ts": offset})
	s.publish(t, "Message 4", map[string]string{"key": "456", "ts": millis})
	// Keyless: no attribute, or an empty one; both fall back to the message ID.
	keylessID := s.publish(t, "keyless", map[string]string{"ts": millis})
	s.publish(t, "empty key", map[string]string{"key": "", "ts": rfc3339})
	// An event whose key happens to equal the keyless message's ID.
	s.publish(t, "key equals an ID", map[string]string{"key": keylessID, "ts": millis})
	fence := s.barrier(t, "end of input")

	// dedupflow keeps a message-ID key apart from attribute keys (the
	// "message-id:" namespace); Beam's record IDs share one space, so Beam
	// emits only one of the keyless message and the event keyed by its ID.
	wantBeam := slices.Sorted(slices.Values(append([]string{"Message 1", "one of Message 2, 3, 4", "empty key",
		"one of keyless, key equals an ID"}, fence...)))
	if got := byKey(s.beamOut.data(), beamCopies); !slices.Equal(got, wantBeam) {
		t.Errorf("Beam wrote %q, want %q", got, wantBeam)
	}
	want := slices.Sorted(slices.Values(append([]string{"Message 1", "one of Message 2, 3, 4", "empty key",
		"keyless", "key equals an ID"}, fence...)))
	if got := byKey(s.dfOut.data(), copies); !slices.Equal(got, want) {
		t.Errorf("dedupflow wrote %q, want %q", got, want)
	}

	// Attributes: Beam's writeStrings writes the payload only; dedupflow
	// keeps the input's attributes and carries the key it deduped on.
	for _, data := range s.beamOut.data() {
		if m := s.beamOut.find(data); len(m.Attributes) != 0 {
			t.Errorf("Beam's %q carries attributes %v, want none (writeStrings)", data, m.Attributes)
		}
	}
	for data, want := range map[string]map[string]string{
		"Message 1": {"key": "123", "ts": millis},
		"keyless":   {"key": "message-id:" + keylessID, "ts": millis},
	} {
		if m := s.dfOut.find(data); m == nil || !maps.Equal(m.Attributes, want) {
			t.Errorf("dedupflow's %q: %v, want attributes %v", data, m, want)
		}
	}

	// Redeliveries: both input subscriptions go back to before the first
	// message, and every message comes again with its message ID. Both
	// drop them all.
	for i, sub := range s.inputSubs {
		if _, err := s.c.SubscriptionAdminClient.Seek(context.Background(), &pb.SeekRequest{
			Subscription: sub, Target: &pb.SeekRequest_Snapshot{Snapshot: s.snaps[i]}}); err != nil {
			t.Fatal(err)
		}
	}
	fence = s.barrier(t, "end of redeliveries")
	if got, want := byKey(s.beamOut.data(), beamCopies), slices.Sorted(slices.Values(append(wantBeam, fence...))); !slices.Equal(got, want) {
		t.Errorf("Beam after the seek back: %q, want %q", got, want)
	}
	if got, want := byKey(s.dfOut.data(), copies), slices.Sorted(slices.Values(append(want, fence...))); !slices.Equal(got, want) {
		t.Errorf("dedupflow after the seek back: %q, want %q", got, want)
	}

	// A timestamp neither form reads: dedupflow dead-letters the message
	// with the reason and goes on; Beam's reader throws, and the
	// DirectRunner ends the pipeline with the error (Dataflow would retry
	// the bundle, and hold the subscription back, until the message is
	// removed).
	s.publish(t, "bad time", map[string]string{"key": "789", "ts": "yesterday"})
	dl := s.dfDeadLetter.wait(t, "dedupflow's dead-letter topic", "bad time", time.Minute)
	if dl.Attributes["dedupflow_error"] == "" {
		t.Errorf("dead-lettered without a reason: %v", dl.Attributes)
	}
	s.beam.waitFor(t, reBadTimestamp, 2*time.Minute)
	select {
	case <-s.beam.exited:
	case <-time.After(time.Minute):
		t.Errorf("Beam still running a minute after the bad timestamp")
	}
	if s.beam.err == nil {
		t.Errorf("Beam exited 0 after a bad timestamp, want its pipeline failed")
	}
	if got := s.dfOut.find("bad time"); got != nil {
		t.Errorf("dedupflow emitted the message with a bad timestamp")
	}
	if code := s.dedupflow.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("dedupflow pipeline exited %d after SIGTERM:\n%s", code, s.dedupflow.out.String())
	}
	// dedupflow removes the subscription it made; Beam leaves its own.
	if subs := s.listInputSubs(t); len(subs) != 1 || !strings.Contains(subs[0], "_beam_") {
		t.Errorf("input subscriptions after both ended: %q, want only Beam's", subs)
	}
	for _, o := range []*output{s.beamOut, s.dfOut, s.dfDeadLetter} {
		o.stop()
	}
	if code := s.broker.stop(t, syscall.SIGTERM); code != 0 {
		t.Errorf("dedupflow broker exited %d after SIGTERM:\n%s", code, s.broker.out.String())
	}
}
