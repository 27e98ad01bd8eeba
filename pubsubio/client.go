package pubsubio

import (
	"context"
	"fmt"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// NewClient connects to Pub/Sub: to the emulator in PUBSUB_EMULATOR_HOST
// when it is set (the official client reads it), else to the service with
// Application Default Credentials.
func NewClient(ctx context.Context, project string, opts ...option.ClientOption) (*pubsub.Client, error) {
	c, err := pubsub.NewClient(ctx, project, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to pubsub: %w", err)
	}
	return c, nil
}

// Insecure returns the options that reach a server at addr (an emulator on
// loopback) without TLS or credentials.
func Insecure(addr string) []option.ClientOption {
	return []option.ClientOption{
		option.WithEndpoint(addr),
		option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())),
	}
}
