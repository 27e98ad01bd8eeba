// Command brokerd runs a broker for the broker package's crash tests, which
// need a process they can kill -9. It prints the address it listens on as
// its first line of output. (cmd/dedupflow is the real command; this keeps
// the crash tests independent of the other subcommands.)
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dedupflow/dedupflow/broker"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "host:port")
	dataDir := flag.String("data-dir", "", "data directory")
	compact := flag.Int64("compact-size", 0, "log size that starts a compaction (0: the broker's default)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	b, err := broker.New(broker.Options{DataDir: *dataDir, CompactSize: *compact, Logger: log, Now: time.Now,
		Exports: broker.ExportOptionsFromEnv(os.Getenv)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	addr, err := b.Listen(*listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(addr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	if err := b.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
