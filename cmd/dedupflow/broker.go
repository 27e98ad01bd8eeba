package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/dedupflow/dedupflow/broker"
)

// runBroker serves a Pub/Sub-compatible broker until ctx is cancelled
// (SIGINT/SIGTERM), then shuts it down gracefully.
func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "127.0.0.1:8085", "`host:port` to serve gRPC on (port 0 picks a free one)")
	dataDir := fs.String("data-dir", "", "`dir`ectory that makes topics, subscriptions and unacknowledged messages durable; empty keeps everything in memory")
	noSync := fs.Bool("no-sync", false, "with --data-dir, skip fsync: messages survive the process dying, not a power loss")
	verbose := fs.Bool("v", false, "log debug messages")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dedupflow broker [--listen host:port] [--data-dir DIR] [--no-sync] [-v]")
		fmt.Fprintln(stderr, "\nServes the google.pubsub.v1 API; point clients at it with PUBSUB_EMULATOR_HOST.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("broker: unexpected arguments %q", fs.Args())
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	b, err := broker.New(broker.Options{DataDir: *dataDir, NoSync: *noSync, Logger: log, Now: time.Now})
	if err != nil {
		return err
	}
	addr, err := b.Listen(*listen)
	if err != nil {
		b.Close()
		return err
	}
	durability := "in memory"
	if *dataDir != "" {
		durability = "data in " + *dataDir
		if *noSync {
			durability += " (no fsync)"
		}
	}
	log.Info("broker listening", "addr", addr, "durability", durability)
	fmt.Fprintf(stdout, "export PUBSUB_EMULATOR_HOST=%s\n", addr)

	<-ctx.Done()
	log.Info("broker shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return b.Shutdown(sctx)
}
