package deploy

import (
	"bufio"
	"crypto/x509"
	"debug/elf"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// The image built from ./Dockerfile: a static binary as its entrypoint, run
// as a non-root user, with CA certificates and time zone data; its
// entrypoint answers --help from the image's own files.
func TestImage(t *testing.T) {
	im := mountImage(t, testenv.Image(t))
	if !slices.Equal(im.entrypoint, []string{"dedupflow"}) {
		t.Errorf("ENTRYPOINT %q, want [\"dedupflow\"]", im.entrypoint)
	}
	uid, _, _ := strings.Cut(im.user, ":")
	if uid == "" || uid == "0" || uid == "root" || strings.Trim(uid, "0123456789") != "" {
		t.Errorf("USER %q: want a numeric non-root uid (Kubernetes' runAsNonRoot checks a number)", im.user)
	}
	if !hasPasswdEntry(t, filepath.Join(im.root, "etc/passwd"), uid) {
		t.Errorf("/etc/passwd has no entry for uid %s", uid)
	}

	bin := filepath.Join(im.root, im.lookPath(t, "dedupflow"))
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary has a dynamic loader (PT_INTERP): it is not static and cannot run on an empty base")
		}
	}

	pem, err := os.ReadFile(filepath.Join(im.root, "etc/ssl/certs/ca-certificates.crt"))
	if err != nil {
		t.Fatal(err)
	}
	if pool := x509.NewCertPool(); !pool.AppendCertsFromPEM(pem) {
		t.Error("etc/ssl/certs/ca-certificates.crt holds no certificate")
	}
	tz, err := os.ReadFile(filepath.Join(im.root, "usr/share/zoneinfo/Europe/Berlin"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := time.LoadLocationFromTZData("Europe/Berlin", tz); err != nil {
		t.Errorf("zoneinfo: %v", err)
	}

	out, err := im.command(t, nil, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "usage: dedupflow COMMAND") {
		t.Fatalf("dedupflow --help from the image: %v\n%s", err, out)
	}
}

func hasPasswdEntry(t *testing.T, path, uid string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if fields := strings.Split(s.Text(), ":"); len(fields) > 2 && fields[2] == uid {
			return true
		}
	}
	return false
}
