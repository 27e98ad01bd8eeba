package pubsubio

import (
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// NewClient connects to Pub/Sub: to the emulator in PUBSUB_EMULATOR_HOST
// when it is set (the official client reads it), else to the service with
// Application Default Credentials.
func NewClient(ctx context.Context, project string, opts ...option.ClientOption) (*pubsub.Client, error) {
	host := os.Getenv(emulatorVar)
	if host != "" && len(opts) == 0 {
		if err := checkEmulator(ctx, host); err != nil {
			return nil, err
		}
	}
	c, err := pubsub.NewClient(ctx, project, opts...)
	switch {
	case err == nil:
		return c, nil
	case host == "" && len(opts) == 0:
		return nil, fmt.Errorf("connect to pubsub: %w (%s is not set, so Google Cloud was tried: set it to the host:port of an emulator or dedupflow broker to use one)", err, emulatorVar)
	}
	return nil, fmt.Errorf("connect to pubsub: %w", err)
}

const emulatorVar = "PUBSUB_EMULATOR_HOST"

// emulatorWait bounds the wait for the emulator to listen (one started
// beside us may still be starting): the client itself would wait a minute
// per call and then say only that its deadline passed.
const emulatorWait = 10 * time.Second

// checkEmulator tells at start that nothing listens at the emulator's
// address, or that what listens there is not a gRPC server.
func checkEmulator(parent context.Context, host string) error {
	if err := checkAddr(host); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(parent, emulatorWait)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", host)
		if err == nil {
			err = speaksGRPC(ctx, conn)
			conn.Close()
			switch {
			case parent.Err() != nil:
				return fmt.Errorf("connect to pubsub: %w", parent.Err())
			case err != nil:
				return fmt.Errorf("%s=%s is not a Pub/Sub server: %w; give the host:port of the emulator or dedupflow broker (the broker's --listen, not its console)", emulatorVar, host, err)
			}
			return nil
		}
		select {
		case <-parent.Done():
			// A stop, not a verdict on the emulator.
			return fmt.Errorf("connect to pubsub: %w", parent.Err())
		case <-ctx.Done():
			return fmt.Errorf("%s=%s: the Pub/Sub emulator does not answer there within %v (%w): start it (dedupflow broker, or gcloud beta emulators pubsub start), or unset %s to use Google Cloud",
				emulatorVar, host, emulatorWait, err, emulatorVar)
		case <-time.After(200 * time.Millisecond):
		}
	}
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
