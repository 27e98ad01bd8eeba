package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/agnivade/levenshtein"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/publisher"
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
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", env, v, e)
				return
			}
			f.Value = fromEnv{f.Value}
		}
	})
	return err
}

// fromEnv marks a flag that parse set from its environment variable, for
// envNamed.
type fromEnv struct{ flag.Value }

// envNamed adds to err which of the flags it names took their values from
// DEDUPFLOW_* variables: a user who set DEDUPFLOW_ON_CONFLICT looks for
// that, not for --on-conflict. Every command returns its errors through it.
func envNamed(fs *flag.FlagSet, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	var from []string
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := f.Value.(fromEnv); ok && names(msg, "--"+f.Name) {
			from = append(from, "--"+f.Name+" is $"+envName(f.Name))
		}
	})
	if len(from) == 0 {
		return err
	}
	return fmt.Errorf("%w (%s)", err, strings.Join(from, ", "))
}

// names reports whether msg speaks of flag, and not only of a longer one
// that begins with it (--sink, not --sink-timeout).
func names(msg, flag string) bool {
	for i := strings.Index(msg, flag); i >= 0; {
		end := i + len(flag)
		if end == len(msg) || !strings.ContainsRune("abcdefghijklmnopqrstuvwxyz0123456789-", rune(msg[end])) {
			return true
		}
		j := strings.Index(msg[end:], flag)
		if j < 0 {
			break
		}
		i = end + j
	}
	return false
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

// envName is the variable a flag is read from when not given.
func envName(flag string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

const envPrefix = "DEDUPFLOW_"

// testVariables are the DEDUPFLOW_* variables the tests read
// (docs/testing.md): CI sets them around the commands it runs, so they are
// not mistakes.
var testVariables = []string{"DEDUPFLOW_REDIS_URL", "DEDUPFLOW_POSTGRES_URL", "DEDUPFLOW_EMULATOR_HOST",
	"DEDUPFLOW_CHROMIUM", "DEDUPFLOW_NODE_DIR", "DEDUPFLOW_PYTHON", "DEDUPFLOW_REDIS_SERVER", "DEDUPFLOW_SPRING_JAR",
	"DEDUPFLOW_SPRING2020_JAR", "DEDUPFLOW_BEAM_JAR", "DEDUPFLOW_REQUIRE_SERVERS", "DEDUPFLOW_IMAGE", "DEDUPFLOW_UPDATE_SCREENSHOT",
	"DEDUPFLOW_CRASH_KEYS", "DEDUPFLOW_CRASH_SEED", "DEDUPFLOW_BENCH_KEYS", "DEDUPFLOW_BENCH_FILE", "DEDUPFLOW_BENTO",
	"DEDUPFLOW_DISK_KILL_CHILD", "DEDUPFLOW_DISK_FAULT_CHILD", "DEDUPFLOW_STORAGE_EMULATOR_HOST"}

// warnUnread warns about each DEDUPFLOW_* variable in env that no flag of
// fs reads, naming the nearest one that a flag does: a misspelt
// DEDUPFLOW_STAT would otherwise leave every replica on its own memory
// store without a word.
func warnUnread(log *slog.Logger, fs *flag.FlagSet, env []string) {
	known := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { known[envName(f.Name)] = true })
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(name, envPrefix) || known[name] || slices.Contains(testVariables, name) {
			continue
		}
		nearest, best := "", -1
		for k := range known {
			if d := levenshtein.ComputeDistance(name, k); best < 0 || d < best || d == best && k < nearest {
				nearest, best = k, d
			}
		}
		log.Warn("environment variable ignored: no flag of this command reads it", "variable", name, "nearest", nearest, "command", fs.Name())
	}
}

type logFlags struct {
	format, level string
	fs            *flag.FlagSet // the command's, whose variables the logger checks
}

func (l *logFlags) register(fs *flag.FlagSet) {
	l.fs = fs
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
	var log *slog.Logger
	switch l.format {
	case "text":
		log = slog.New(slog.NewTextHandler(w, o))
	case "json":
		log = slog.New(slog.NewJSONHandler(w, o))
	default:
		return nil, fmt.Errorf("--log-format %q: want text or json", l.format)
	}
	if l.fs != nil {
		warnUnread(log, l.fs, os.Environ())
	}
	return log, nil
}

// clientProject is the project a client is made for: --project, or else
// that of the resource it works on (a full name may be in another one).
func clientProject(project string, n pubsubio.Name) string {
	if project != "" {
		return project
	}
	return n.Project
}

// idAttributeVar defines --id-attribute, the attribute publishers stamp the
// key into (the pipeline's and up's flag of the same name), and its former
// name --key-attribute. The returned resolve, called after parse, applies
// the former name with a warning, and refuses the two names set to
// different values, on the command line or in the environment, rather than
// guess which one the user meant.
func idAttributeVar(fs *flag.FlagSet, p *string, usage string) (resolve func(*slog.Logger) error) {
	fs.StringVar(p, "id-attribute", publisher.DefaultIDAttribute, usage)
	var former string
	fs.StringVar(&former, "key-attribute", "", "deprecated: the former name of --id-attribute")
	return func(log *slog.Logger) error {
		set := given(fs)
		if !set["key-attribute"] {
			return nil
		}
		log.Warn("--key-attribute is now --id-attribute, the name the pipeline and up use; the old name will be removed")
		if set["id-attribute"] && *p != former {
			return fmt.Errorf("--id-attribute %q and its former name --key-attribute %q differ: give --id-attribute only", *p, former)
		}
		*p = former
		return nil
	}
}
