package pubsubio

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestNewClientEmulatorDown: with PUBSUB_EMULATOR_HOST at a port where
// nothing listens, NewClient says so within seconds, naming the variable
// and the address, instead of each call waiting a minute.
func TestNewClientEmulatorDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("PUBSUB_EMULATOR_HOST", addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := NewClient(ctx, "p")
	if err == nil {
		defer c.Close()
		// Before the check, the first call is where it shows.
		_, err = c.TopicAdminClient.GetTopic(ctx, nil)
	}
	if err == nil || !strings.Contains(err.Error(), "PUBSUB_EMULATOR_HOST="+addr) || !strings.Contains(err.Error(), "does not answer") {
		t.Errorf("emulator down: %v, want an error naming PUBSUB_EMULATOR_HOST=%s", err, addr)
	}
}

// TestNewClientNoCredentials: without the variable and without
// credentials, the error says that PUBSUB_EMULATOR_HOST would pick an
// emulator.
func TestNewClientNoCredentials(t *testing.T) {
	t.Setenv("PUBSUB_EMULATOR_HOST", "")
	t.Setenv("GOOGLE_APPLICATION_CREDENTIALS", "")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("CLOUDSDK_CONFIG", t.TempDir())
	c, err := NewClient(context.Background(), "p")
	if err == nil {
		c.Close()
		testenv.Cannot(t, "this machine has Application Default Credentials (a Google Cloud VM's metadata server), so no error to check")
	}
	if !strings.Contains(err.Error(), "PUBSUB_EMULATOR_HOST") {
		t.Errorf("no credentials: %v, want it to mention PUBSUB_EMULATOR_HOST", err)
	}
}
