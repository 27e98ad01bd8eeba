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
	"runtime/debug"
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
	ctx, stop := stopContext()
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if errors.Is(err, flag.ErrHelp) {
		// -h asked for the usage and got it: not a failure.
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dedupflow:", err)
		os.Exit(exitCode(err))
	}
}

// stopContext is cancelled by SIGINT or SIGTERM, with the signal as its
// cause, until stop.
func stopContext() (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigs:
			cancel(stopSignal{s.(syscall.Signal)})
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(sigs)
		close(done)
		cancel(nil)
	}
}

// stopSignal is the signal that stopped the run.
type stopSignal struct{ sig syscall.Signal }

func (s stopSignal) Error() string { return s.sig.String() }

// interruptedError is a command that does its work and ends (publish,
// loadgen) cut short by a stop: a failure, as a script needs to see.
type interruptedError struct {
	cmd string
	sig syscall.Signal // 0: not from a signal
	err error
}

func (e *interruptedError) Error() string {
	by := ""
	switch e.sig {
	case syscall.SIGINT:
		by = " by SIGINT (Ctrl-C)"
	case syscall.SIGTERM:
		by = " by SIGTERM"
	}
	return fmt.Sprintf("%s interrupted%s before it finished", e.cmd, by)
}

func (e *interruptedError) Unwrap() error { return e.err }

// exitCode is 128 plus the signal for a run a signal cut short, as
// shells report it (130 for Ctrl-C), and 2 for any other failure.
func exitCode(err error) int {
	var ie *interruptedError
	if errors.As(err, &ie) {
		if ie.sig != 0 {
			return 128 + int(ie.sig)
		}
		return 128 + int(syscall.SIGINT)
	}
	return 2
}

// canceled tells a run that a stop cut short from one that failed.
func canceled(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() != nil && (errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version" || args[0] == "version") {
		_, err := fmt.Fprintln(stdout, version())
		return err
	}
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
			if canceled(ctx, err) {
				if c.service {
					// SIGTERM while starting (a rollout, a scale-down) is a
					// stop as asked: nothing was taken, so nothing failed.
					return nil
				}
				ie := &interruptedError{cmd: c.name, err: err}
				if s, ok := context.Cause(ctx).(stopSignal); ok {
					ie.sig = s.sig
				}
				err = ie
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
	fmt.Fprintln(w, "\nRun dedupflow COMMAND -h for its flags, dedupflow --version for the build.")
}

// version names the module version and the commit it was built from.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "dedupflow (no build information)"
	}
	v := "dedupflow " + bi.Main.Version
	var rev, modified string
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			if s.Value == "true" {
				modified = ", modified"
			}
		}
	}
	if rev != "" {
		v += " (commit " + rev + modified + ")"
	}
	return v + " " + bi.GoVersion
}
