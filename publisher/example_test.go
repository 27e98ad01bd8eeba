package publisher_test

import (
	"context"
	"errors"
	"fmt"
	"log"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"

	"github.com/dedupflow/dedupflow/publisher"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// Publish an order event with its business key, then publish it again the
// way a producer's retry would: the second copy is a new message with a new
// ID and the same key, which a pipeline deduplicating on event_id drops.
func Example() {
	ctx := context.Background()
	// An in-process Pub/Sub server, so the example runs anywhere; against
	// the service, drop the options (or set PUBSUB_EMULATOR_HOST).
	srv := pstest.NewServer()
	defer srv.Close()
	client, err := pubsub.NewClient(ctx, "my-project", pubsubio.Insecure(srv.Addr)...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: "projects/my-project/topics/orders"}); err != nil {
		log.Fatal(err)
	}

	pub := client.Publisher("orders")
	defer pub.Stop()
	p, err := publisher.New(pub, publisher.Options{IDAttribute: "event_id"})
	if err != nil {
		log.Fatal(err)
	}
	for range 2 {
		r := p.Publish(ctx, publisher.Event{Key: "order-123", Data: []byte(`{"total":42}`)})
		id, err := r.Get(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("published message %s with event_id=%s\n", id, r.Key())
	}
	// Output:
	// published message m0 with event_id=order-123
	// published message m1 with event_id=order-123
}

// An event that could never be published fails before the first attempt,
// with an error that says why.
func Example_invalidEvent() {
	ctx := context.Background()
	srv := pstest.NewServer()
	defer srv.Close()
	client, err := pubsub.NewClient(ctx, "my-project", pubsubio.Insecure(srv.Addr)...)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	pub := client.Publisher("orders")
	defer pub.Stop()
	p, err := publisher.New(pub, publisher.Options{})
	if err != nil {
		log.Fatal(err)
	}

	_, err = p.Publish(ctx, publisher.Event{Key: "order-123"}).Get(ctx)
	fmt.Println(err)
	fmt.Println(errors.Is(err, publisher.ErrEmptyEvent))
	// Output:
	// event key="order-123": invalid event: empty message: no data and no attributes: give data or at least one attribute
	// true
}
