package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/dedupflow/dedupflow/broker"
)

// brokerConfig is what `dedupflow broker` is told.
type brokerConfig struct {
	listen  string
	dataDir string
	noSync  bool
	verbose bool
	log     logFlags
}

func (b *brokerConfig) register(fs *flag.FlagSet) {
	fs.StringVar(&b.listen, "listen", "127.0.0.1:8085", "`host:port` to serve gRPC on (port 0 picks a free one)")
	fs.StringVar(&b.dataDir, "data-dir", "", "`dir`ectory that makes topics, subscriptions and unacknowledged messages durable; empty keeps everything in memory")
	fs.BoolVar(&b.noSync, "no-sync", false, "with --data-dir, skip fsync: messages survive the process dying, not a power loss")
	fs.BoolVar(&b.verbose, "v", false, "log debug messages (as --log-level debug)")
	b.log.register(fs)
}

// runBroker serves a Pub/Sub-compatible broker until ctx is cancelled
// (SIGINT/SIGTERM), then shuts it down gracefully.
func runBroker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var cfg brokerConfig
	fs := newFlags("broker", stderr)
	cfg.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dedupflow broker [--listen host:port] [--data-dir DIR] [--no-sync] [-v]")
		fmt.Fprintln(stderr, "\nServes the google.pubsub.v1 API; point clients at it with PUBSUB_EMULATOR_HOST.")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	if cfg.verbose {
		cfg.log.level = "debug"
	}
	log, err := cfg.log.logger(stderr)
	if err != nil {
		return err
	}

	b, err := broker.New(broker.Options{DataDir: cfg.dataDir, NoSync: cfg.noSync, Logger: log, Now: time.Now})
	if err != nil {
		return err
	}
	addr, err := b.Listen(cfg.listen)
	if err != nil {
		b.Close()
		return err
	}
	durability := "in memory"
	if cfg.dataDir != "" {
		durability = "data in " + cfg.dataDir
		if cfg.noSync {
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
