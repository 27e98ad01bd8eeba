package examples

import (
	"context"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// BenchmarkTutorialJob runs the tutorial's job on Beam's DirectRunner and
// as dedupflow pipeline, one after the other against one broker, and
// reports for each the messages per second in (from the first publish to
// the last output) and the pipeline process's CPU per message in. Every
// fifth message republishes the previous one's key. Run it with a fixed
// count, e.g. -benchtime=20000x; BENCHMARKS.md has the figures.
func BenchmarkTutorialJob(b *testing.B) {
	jar := testenv.BeamReferenceJar(b)
	java := testenv.Tool(b, "java")
	bin := buildDedupflow(b)
	broker := start(b, nil, bin, "broker", "--listen", "127.0.0.1:0", "--project", beamProject)
	addr := broker.waitFor(b, reEmulator, 30*time.Second)
	c := client(b, beamProject, addr)
	run := 0
	sides := []struct {
		name  string
		start func(b *testing.B, in, out string) *proc
	}{
		{"beam", func(b *testing.B, in, out string) *proc {
			return start(b, nil, java, "-jar", jar, "--pubsubRootUrl=http://"+addr, "--project="+beamProject,
				"--credentialFactoryClass=org.apache.beam.sdk.extensions.gcp.auth.NoopCredentialFactory",
				"--inputSubscription="+in, "--outputTopic="+out, "--idAttribute=key")
		}},
		// The DirectRunner checks by default that no step changes its input
		// and that every element survives its coder, for tests; here off.
		{"beam-unchecked", func(b *testing.B, in, out string) *proc {
			return start(b, nil, java, "-jar", jar, "--pubsubRootUrl=http://"+addr, "--project="+beamProject,
				"--credentialFactoryClass=org.apache.beam.sdk.extensions.gcp.auth.NoopCredentialFactory",
				"--inputSubscription="+in, "--outputTopic="+out, "--idAttribute=key",
				"--enforceImmutability=false", "--enforceEncodability=false")
		}},
		{"dedupflow", func(b *testing.B, in, out string) *proc {
			return start(b, []string{"PUBSUB_EMULATOR_HOST=" + addr}, bin, "pipeline", "--project="+beamProject,
				"--inputSubscription="+in, "--outputTopic="+out, "--idAttribute=key", "--metrics-addr=127.0.0.1:0")
		}},
	}
	for _, side := range sides {
		b.Run(side.name, func(b *testing.B) {
			run++
			in, out := fmt.Sprintf("bench-in-%d", run), fmt.Sprintf("bench-out-%d", run)
			for _, topic := range []string{in, out} {
				if _, err := c.TopicAdminClient.CreateTopic(context.Background(), &pb.Topic{Name: topicPath(topic)}); err != nil {
					b.Fatal(err)
				}
			}
			for sub, topic := range map[string]string{in: in, out: out} {
				if _, err := c.SubscriptionAdminClient.CreateSubscription(context.Background(), &pb.Subscription{
					Name: "projects/" + beamProject + "/subscriptions/" + sub, Topic: topicPath(topic), AckDeadlineSeconds: 60}); err != nil {
					b.Fatal(err)
				}
			}
			got := collect(b, c, out)
			p := side.start(b, "projects/"+beamProject+"/subscriptions/"+in, topicPath(out))
			pub := c.Publisher(in)
			defer pub.Stop()
			// One message through first: the pipeline is reading and writing.
			publish(b, pub, []string{"warm-up"})
			got.count(b, side.name+" warm-up", 1, 3*time.Minute)

			keys := make([]string, b.N)
			distinct := 0
			for i := range keys {
				if i%5 == 4 {
					keys[i] = keys[i-1]
					continue
				}
				keys[i] = "k-" + strconv.Itoa(i)
				distinct++
			}
			cpu0, err := testenv.ProcessCPU(p.cmd.Process.Pid)
			if err != nil {
				testenv.Missing(b, err.Error())
			}
			b.ResetTimer()
			began := time.Now()
			publish(b, pub, keys)
			got.count(b, side.name, 1+distinct, 10*time.Minute)
			elapsed := time.Since(began)
			b.StopTimer()
			cpu1, err := testenv.ProcessCPU(p.cmd.Process.Pid)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
			b.ReportMetric(float64(cpu1-cpu0)/float64(b.N), "cpu-ns/msg")
			p.stop(b, syscall.SIGTERM)
		})
	}
}

// publish sends one message per key, data the key itself, and waits for
// all of them.
func publish(b *testing.B, pub *pubsub.Publisher, keys []string) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	results := make([]*pubsub.PublishResult, len(keys))
	for i, k := range keys {
		results[i] = pub.Publish(ctx, &pubsub.Message{
			Data: []byte(fmt.Sprintf("%d %s", i, k)), Attributes: map[string]string{"key": k}})
	}
	for _, r := range results {
		if _, err := r.Get(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
