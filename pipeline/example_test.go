package pipeline_test

import (
	"context"
	"fmt"
	"log"
	"slices"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio/pull"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/store/mem"
)

// keys is a sink that remembers the keys it wrote, and says when it has n.
type keys struct {
	mu   sync.Mutex
	got  []string
	n    int
	done func()
}

func (k *keys) Write(_ context.Context, m *sink.Message) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.got = append(k.got, m.Key); len(k.got) == k.n {
		k.done()
	}
	return nil
}

// A Go program runs the pipeline on the batch receiver, as the dedupflow
// binary does: StreamingPull on the low-level client, one store call, one
// sink write and one ack request per batch. The publisher retried order-1,
// so it is stored twice with two message IDs; the sink gets it once.
func Example_batch() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// An in-process Pub/Sub server; in production, pubsub.NewClient(ctx, project).
	srv := pstest.NewServer()
	defer srv.Close()
	client, err := pubsub.NewClient(ctx, "shop",
		option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: "projects/shop/topics/orders"}); err != nil {
		log.Fatal(err)
	}
	if _, err := client.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
		Name: "projects/shop/subscriptions/ledger", Topic: "projects/shop/topics/orders", AckDeadlineSeconds: 10,
	}); err != nil {
		log.Fatal(err)
	}
	pub := client.Publisher("orders")
	defer pub.Stop()
	for _, key := range []string{"order-1", "order-1", "order-2"} {
		if _, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("paid"), Attributes: map[string]string{"event_id": key}}).Get(ctx); err != nil {
			log.Fatal(err)
		}
	}

	run, stop := context.WithCancel(ctx)
	out := &keys{n: 2, done: stop} // both events written: stop receiving
	p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "event_id"}},
		pipeline.Deps{Store: mem.New(), Sink: out})
	if err != nil {
		log.Fatal(err)
	}
	in, err := pull.New(client.SubscriptionAdminClient, "projects/shop/subscriptions/ledger", pull.Options{})
	if err != nil {
		log.Fatal(err)
	}
	if err := p.RunBatch(run, in); err != nil {
		log.Fatal(err)
	}
	slices.Sort(out.got)
	fmt.Println(out.got)
	// Output:
	// [order-1 order-2]
}
