// Command dedupflow removes Pub/Sub duplicates — redeliveries and
// republished copies — and runs the whole tutorial on one machine.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/redact"
)

type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) error
	// service: the command runs until it is stopped, so a stop (SIGTERM,
	// Ctrl-C) that ends it with a cancellation is its normal end. For the
	// others it cut their work short, and that stays a failure.
	service bool
}

func commands() []command {
	return []command{
		{"up", "run the tutorial: broker, dedup pipeline and web console", runUp, true},
		{"pipeline", "dedup a subscription (or topic) into a topic or database", runPipeline, true},
		{"broker", "serve a Pub/Sub-compatible broker", runBroker, true},
		{"publish", "publish messages, optionally as retried copies", runPublish, false},
		{"subscribe", "print the messages of a subscription", runSubscribe, true},
		{"loadgen", "publish logical events with duplicates, for tests and benchmarks", runLoadgen, false},
		{"advise", "tell how long the horizon has to be, from a running pipeline's metrics", runAdvise, false},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		// -h asked for the usage and got it: not a failure.
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dedupflow:", err)
		os.Exit(2)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr)
		if len(args) == 0 {
			return errors.New("no command given")
		}
		return flag.ErrHelp
	}
	for _, c := range commands() {
		if c.name == args[0] {
			err := c.run(ctx, args[1:], stdout, stderr)
			if c.service && err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled) {
				// SIGTERM while starting (a rollout, a scale-down) is a
				// stop as asked: nothing was taken, so nothing failed.
				return nil
			}
			// No password of a URL the user gave may reach the terminal.
			return redact.Error(err)
		}
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", args[0])
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: dedupflow COMMAND [flags]\n\ncommands:")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun dedupflow COMMAND -h for its flags.")
}
