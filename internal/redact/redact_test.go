package redact

import (
	"bytes"
	"errors"
	"log/slog"
	"net/url"
	"strings"
	"testing"
)

func TestText(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:s3cretPW@127.0.0.1:6390/0":                   "redis://:xxxxx@127.0.0.1:6390/0",
		"rediss://user:p@ss:w@host/0":                          "rediss://user:xxxxx@host/0",
		"postgres://u:pw@db:5432/x?sslmode=disable":            "postgres://u:xxxxx@db:5432/x?sslmode=disable",
		`parse "redis://:pw@127.0.0.1:bad/0": invalid port`:    `parse "redis://:xxxxx@127.0.0.1:bad/0": invalid port`,
		"https://user@example.com/push and http://a:b@c/ next": "https://user@example.com/push and http://a:xxxxx@c/ next",
		"mem":                "mem",
		"file:/var/lib/x.db": "file:/var/lib/x.db",
	} {
		if got := Text(in); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://:s3cretPW@127.0.0.1:6390/0": "redis://:xxxxx@127.0.0.1:6390/0",
		"redis://:s3cretPW@127.0.0.1:bad/0":  "redis://:xxxxx@127.0.0.1:bad/0",
		"postgres://u@db/x":                  "postgres://u@db/x",
	} {
		if got := URL(in); got != want {
			t.Errorf("URL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestError(t *testing.T) {
	//lint:ignore SA1007 a URL net/url refuses is the point
	_, perr := url.Parse("redis://:s3cretPW@127.0.0.1:bad/0")
	err := Error(perr)
	if strings.Contains(err.Error(), "s3cretPW") {
		t.Errorf("Error: %v still holds the password", err)
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		t.Errorf("Error hides the *url.Error from errors.As")
	}
	if Error(nil) != nil {
		t.Error("Error(nil) != nil")
	}
}

func TestAttr(t *testing.T) {
	var b bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{ReplaceAttr: Attr}))
	log.Info("x", "state", "redis://:s3cretPW@h:1/0", "err", errors.New("dial postgres://u:s3cretPW@h/db: refused"))
	if strings.Contains(b.String(), "s3cretPW") {
		t.Errorf("log line holds the password: %s", b.String())
	}
}
