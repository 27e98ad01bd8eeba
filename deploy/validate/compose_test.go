package validate

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
)

// compose.yaml loads with the compose specification's loader, which checks
// it against the specification's schema (an unknown or misspelled key
// fails), and runs the tutorial from this repository's Dockerfile with its
// ports on loopback only.
func TestComposeFile(t *testing.T) {
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	p, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml")}},
		Environment: types.Mapping{},
	})
	if err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	s, ok := p.Services["dedupflow"]
	if !ok {
		t.Fatalf("no service dedupflow in %v", p.ServiceNames())
	}
	if s.Build == nil || s.Build.Context != filepath.Dir(dir) || s.Build.Dockerfile != "Dockerfile" {
		t.Errorf("build %+v: want the repository's Dockerfile", s.Build)
	}
	if len(s.Command) == 0 || s.Command[0] != "up" {
		t.Errorf("command %q, want dedupflow up", s.Command)
	}
	published := map[string]bool{}
	for _, port := range s.Ports {
		if port.HostIP != "127.0.0.1" {
			t.Errorf("port %s is published on %q, want loopback only", port.Published, port.HostIP)
		}
		published[port.Published] = true
	}
	for _, want := range []string{"8080", "8085"} {
		if !published[want] {
			t.Errorf("port %s (console, broker) not published; got %v", want, s.Ports)
		}
	}
	for _, flag := range []string{"--console-addr", "--broker-addr"} {
		if i := slices.Index(s.Command, flag); i < 0 || i+1 == len(s.Command) || s.Command[i+1][:8] != "0.0.0.0:" {
			t.Errorf("command %q: want %s 0.0.0.0:PORT, or the published port reaches nothing", s.Command, flag)
		}
	}
}

// The loader's schema check is strict: a misspelled key fails.
func TestComposeRejectsMisspelledKeys(t *testing.T) {
	_, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir: t.TempDir(),
		ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: []byte(
			"name: x\nservices:\n  a:\n    image: busybox\n    port: [\"127.0.0.1:80:80\"]\n")}},
		Environment: types.Mapping{},
	})
	if err == nil {
		t.Error("a service with `port:` (for ports) loaded without error")
	}
}
