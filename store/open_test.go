package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/store/disk"
	"github.com/dedupflow/dedupflow/store/mem"
	"github.com/dedupflow/dedupflow/store/redis"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	for _, spec := range []string{"", "mem", "file:" + filepath.Join(t.TempDir(), "state.db"), testenv.RedisURL(t)} {
		s, c, err := Open(ctx, spec, Options{Horizon: time.Hour})
		if err != nil {
			t.Fatalf("%q: %v", spec, err)
		}
		now := time.Now()
		v, err := s.Claim(ctx, dedup.Claim{Key: dedup.KeyOf(t.Name() + now.String()), MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)})
		if err != nil || v.Status != dedup.Proceed {
			t.Fatalf("%q: claim: %v %v", spec, v.Status, err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("%q: close: %v", spec, err)
		}
	}
}

func TestOpenTypes(t *testing.T) {
	ctx := context.Background()
	s, c, err := Open(ctx, "file:"+filepath.Join(t.TempDir(), "state.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, ok := s.(*disk.Store); !ok {
		t.Fatalf("file: opened %T", s)
	}
	if _, ok := s.(interface{ Len() int }); !ok {
		t.Fatal("disk store has no Len")
	}
	if s, _, _ := Open(ctx, "mem", Options{}); s.(*mem.Store) == nil {
		t.Fatal("mem")
	}
}

func TestBadSpecs(t *testing.T) {
	for spec, want := range map[string]string{
		"memory":                  `unknown state "memory": want mem, file:PATH or redis://HOST`,
		"/var/lib/x.db":           `unknown state "/var/lib/x.db": want mem, file:PATH or redis://HOST`,
		"file:":                   `state "file:": empty path: want file:PATH`,
		"file:///var/x.db":        "not a file:// URL",
		"redis://h:1/0?cluster=x": `cluster="x": want true or false`,
		"postgres://h/db":         `unknown state "postgres://h/db"`,
	} {
		_, _, err := Open(context.Background(), spec, Options{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Open(%q): %v, want %q", spec, err, want)
		}
	}
	if _, _, err := MaxHorizon("nope"); err == nil {
		t.Error("MaxHorizon of a bad spec")
	}
}

func TestHorizonBounds(t *testing.T) {
	for spec, want := range map[string]struct {
		max  time.Duration
		kind string
	}{
		"mem": {mem.MaxHorizon, "memory"}, "file:x": {disk.MaxHorizon, "disk"}, "redis://h:1/0": {redis.MaxHorizon, "Redis"},
	} {
		got, kind, err := MaxHorizon(spec)
		if err != nil || got != want.max || kind != want.kind {
			t.Errorf("MaxHorizon(%q) = %v, %s, %v; want %v, %s", spec, got, kind, err, want.max, want.kind)
		}
	}
	_, _, err := Open(context.Background(), "mem", Options{Horizon: mem.MaxHorizon + time.Hour})
	if err == nil || !strings.Contains(err.Error(), "longer than the memory store holds") {
		t.Fatalf("too long a horizon: %v", err)
	}
	_, _, err = Open(context.Background(), "redis://127.0.0.1:1/0", Options{Horizon: time.Minute})
	if !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("redis not listening: %v, want ErrUnavailable", err)
	}
}
