package deploy

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

var flagLine = regexp.MustCompile(`(?m)^\s+-([a-z0-9-]+)`)

// The flags and DEDUPFLOW_* variables that the Kubernetes example and the
// compose file give are flags of the command they run: a misspelled
// variable would otherwise be ignored without a word.
func TestDeployFilesUseRealFlags(t *testing.T) {
	newCmd := dedupflow(t)
	known := map[string]map[string]bool{}
	flagsOf := func(command string) map[string]bool {
		if known[command] == nil {
			out, err := newCmd(nil, command, "-h").CombinedOutput()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatalf("dedupflow %s -h: %v", command, err)
			}
			known[command] = map[string]bool{}
			for _, m := range flagLine.FindAllStringSubmatch(string(out), -1) {
				known[command][m[1]] = true
			}
			if len(known[command]) == 0 {
				t.Fatalf("dedupflow %s -h lists no flags:\n%s", command, out)
			}
		}
		return known[command]
	}
	check := func(where string, args []string, env []string) {
		if len(args) == 0 {
			t.Errorf("%s: no command", where)
			return
		}
		flags := flagsOf(args[0])
		for _, a := range args[1:] {
			if name, ok := strings.CutPrefix(a, "--"); ok {
				name, _, _ = strings.Cut(name, "=")
				if !flags[name] {
					t.Errorf("%s: dedupflow %s has no flag --%s", where, args[0], name)
				}
			}
		}
		for _, e := range env {
			if v, ok := strings.CutPrefix(e, "DEDUPFLOW_"); ok {
				if name := strings.ToLower(strings.ReplaceAll(v, "_", "-")); !flags[name] {
					t.Errorf("%s: %s names no flag of dedupflow %s (it would be ignored)", where, e, args[0])
				}
			}
		}
	}

	files, err := filepath.Glob("kubernetes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	containers := 0
	for _, f := range files {
		r, err := os.Open(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(r)
		for {
			var obj struct {
				Spec struct {
					Template struct {
						Spec struct {
							Containers []struct {
								Image string
								Args  []string
								Env   []struct{ Name string }
							}
						}
					}
				}
			}
			if err := dec.Decode(&obj); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, c := range obj.Spec.Template.Spec.Containers {
				if !strings.Contains(c.Image, "dedupflow") {
					continue
				}
				containers++
				var env []string
				for _, e := range c.Env {
					env = append(env, e.Name)
				}
				check(f, c.Args, env)
			}
		}
		r.Close()
	}
	if containers == 0 {
		t.Error("no dedupflow container in kubernetes/")
	}

	b, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command     []string
			Environment map[string]string
		}
	}
	if err := yaml.Unmarshal(b, &compose); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	for name, s := range compose.Services {
		var env []string
		for k := range s.Environment {
			env = append(env, k)
		}
		check("compose.yaml service "+name, s.Command, env)
	}
}
