package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("dedupflow "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parse reads args, then fills flags left unset from the environment
// (DEDUPFLOW_ plus the flag name in capitals, dashes as underscores): flags
// win over the environment. Positional arguments are an error.
//
// A bad value is one line, the error: the usage is printed for -h and for
// a flag that does not exist, not for a typo in a value.
func parse(fs *flag.FlagSet, args []string) error {
	out := fs.Output()
	var held bytes.Buffer
	fs.SetOutput(&held)
	err := fs.Parse(args)
	fs.SetOutput(out)
	if err != nil && strings.HasPrefix(err.Error(), "invalid value ") {
		return err
	}
	_, _ = held.WriteTo(out)
	if err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q (flags start with --)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := "DEDUPFLOW_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
			}
		}
	})
	return err
}

// given reports which flags were set, on the command line or from the
// environment.
func given(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}

// durationVar defines a duration flag that also takes days ("7d"), as
// every command's durations do; a bad value names the units.
func durationVar(fs *flag.FlagSet, p *time.Duration, name string, value time.Duration, usage string) {
	*p = value
	fs.Var(durationFlag{p}, name, usage)
}

type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f durationFlag) Set(s string) error {
	d, err := audit.ParseDuration(s)
	if err != nil {
		return err
	}
	*f.d = d
	return nil
}

type logFlags struct{ format, level string }

func (l *logFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&l.format, "log-format", "text", "log format: text or json")
	fs.StringVar(&l.level, "log-level", "info", "log level: debug, info, warn or error")
}

func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(l.level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", l.level)
	}
	// Every line masks the passwords of the URLs it names.
	o := &slog.HandlerOptions{Level: lv, ReplaceAttr: redact.Attr}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, o)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
}

// clientProject is the project a client is made for: --project, or else
// that of the resource it works on (a full name may be in another one).
func clientProject(project string, n pubsubio.Name) string {
	if project != "" {
		return project
	}
	return n.Project
}
