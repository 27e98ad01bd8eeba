package consumer_test

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

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// A service consumes a subscription with Receive and wraps its handler.
// The publisher retried order-1, so it is stored twice with two message
// IDs; the handler sees it once, and OnDuplicate reports the copy.
func ExampleHandler() {
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
		Name: "projects/shop/subscriptions/billing", Topic: "projects/shop/topics/orders", AckDeadlineSeconds: 10,
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

	var mu sync.Mutex
	var lines []string
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf(format, args...))
		if len(lines) == 3 {
			cancel() // all three messages are settled: stop receiving
		}
	}

	h, err := consumer.Handler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "event_id", Horizon: 10 * time.Minute}, OnDuplicate: func(_ context.Context, m *pubsub.Message, kind dedup.Kind) {
		say("dropped a %s of %s", kind, m.Attributes["event_id"])
	}}, func(ctx context.Context, m *pubsub.Message) error {
		// Charge the customer, write a row... An error here means "not
		// done": the key is released and the message comes back.
		say("handled %s", m.Attributes["event_id"])
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Subscriber("billing").Receive(ctx, h); err != nil {
		log.Fatal(err)
	}

	slices.Sort(lines) // handlers run concurrently; print in a stable order
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// dropped a republish of order-1
	// handled order-1
	// handled order-2
}
