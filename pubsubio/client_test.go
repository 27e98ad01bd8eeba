package pubsubio

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/api/iterator"

	"github.com/dedupflow/dedupflow/broker"
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

// TestNewClientNotGRPC: with PUBSUB_EMULATOR_HOST at a port that answers
// but does not speak gRPC (a web server, such as the broker's console),
// NewClient says the address is not a Pub/Sub server, instead of every
// call waiting out its deadline in silence.
func TestNewClientNotGRPC(t *testing.T) {
	web := httptest.NewServer(http.NotFoundHandler())
	defer web.Close()
	addr := strings.TrimPrefix(web.URL, "http://")
	t.Setenv("PUBSUB_EMULATOR_HOST", addr)
	c, err := NewClient(context.Background(), "p")
	if err == nil {
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "PUBSUB_EMULATOR_HOST="+addr+" is not a Pub/Sub server") || !strings.Contains(err.Error(), "HTTP/1") {
		t.Errorf("a web server as the emulator: %v, want an error saying it answers in HTTP/1 and is not a Pub/Sub server", err)
	}
}

// TestNewClientEmulatorURL: a URL where the variable takes host:port is
// refused at once, saying what to drop.
func TestNewClientEmulatorURL(t *testing.T) {
	for _, v := range []string{"http://127.0.0.1:8085", "https://localhost:8085/"} {
		t.Setenv("PUBSUB_EMULATOR_HOST", v)
		c, err := NewClient(context.Background(), "p")
		if err == nil {
			c.Close()
		}
		scheme, _, _ := strings.Cut(v, ":")
		if err == nil || !strings.Contains(err.Error(), "drop "+scheme+"://") {
			t.Errorf("PUBSUB_EMULATOR_HOST=%s: %v, want it to say drop %s://", v, err, scheme)
		}
	}
}

// TestNewClientEmulatorUp: the check lets a gRPC server through, ours
// and Google's emulator.
func TestNewClientEmulatorUp(t *testing.T) {
	testenv.EmulatorAndOurs(t, func(t *testing.T) string {
		b, err := broker.New(broker.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		addr, err := b.Listen("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		return addr
	}, func(t *testing.T, host string) {
		t.Setenv("PUBSUB_EMULATOR_HOST", host)
		c, err := NewClient(context.Background(), "p")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		it := c.TopicAdminClient.ListTopics(context.Background(), &pubsubpb.ListTopicsRequest{Project: "projects/p"})
		if _, err := it.Next(); err != nil && !errors.Is(err, iterator.Done) {
			t.Errorf("list topics: %v", err)
		}
	})
}
