package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/redisconn"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// fatal fails the test unless err wraps dedup.ErrFatal and not
// dedup.ErrUnavailable.
func fatal(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, dedup.ErrFatal) || errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("%s: %v, want an error wrapping dedup.ErrFatal only", what, err)
	}
}

func claimNew(s *Store, name string) error {
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := s.Claim(ctx, dedup.Claim{Key: dedup.KeyOf(name), MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)})
	return err
}

// TestPermanentErrors: what retrying cannot fix is told apart from an
// outage, at Open and later, on a server of the test's own (it changes
// users and passwords).
func TestPermanentErrors(t *testing.T) {
	ctx := context.Background()
	addr := testenv.StartRedis(t).Addr()
	admin := goredis.NewClient(&goredis.Options{Addr: addr})
	defer admin.Close()
	acl := func(args ...any) {
		t.Helper()
		if err := admin.Do(ctx, append([]any{"acl", "setuser"}, args...)...).Err(); err != nil {
			t.Fatalf("acl setuser %v: %v", args, err)
		}
	}
	acl("app", "on", ">pw1", "~*", "+@all")
	acl("reader", "on", ">pw", "~*", "+@connection", "+get") // may connect, may not write

	t.Run("WrongPassword", func(t *testing.T) {
		_, err := Open(ctx, fmt.Sprintf("redis://app:nope@%s/0", addr), Options{})
		fatal(t, "open with a wrong password", err)
	})
	t.Run("NoPermission", func(t *testing.T) {
		s := open(t, fmt.Sprintf("redis://reader:pw@%s/0", addr), Options{})
		fatal(t, "claim by a user who may not write", claimNew(s, t.Name()))
	})
	t.Run("NoSuchDatabase", func(t *testing.T) {
		_, err := Open(ctx, fmt.Sprintf("redis://%s/99", addr), Options{})
		fatal(t, "open of database 99", err)
	})
	t.Run("ClusterOnPlainServer", func(t *testing.T) {
		_, err := Open(ctx, fmt.Sprintf("redis://%s?cluster=true", addr), Options{})
		fatal(t, "cluster=true against a server without cluster support", err)
	})
	t.Run("PasswordChanged", func(t *testing.T) {
		// A running store whose password is changed meets WRONGPASS when
		// it reconnects: that is permanent, not an outage.
		s := open(t, fmt.Sprintf("redis://app:pw1@%s/0?max_retries=-1", addr), Options{})
		if err := claimNew(s, t.Name()+"/before"); err != nil {
			t.Fatalf("before the change: %v", err)
		}
		acl("app", "resetpass", ">pw2")
		if err := admin.Do(ctx, "client", "kill", "user", "app").Err(); err != nil {
			t.Fatalf("client kill: %v", err)
		}
		var err error
		for range 3 { // a call may first meet the connection the server closed
			if err = claimNew(s, t.Name()+"/after"); errors.Is(err, dedup.ErrFatal) {
				break
			}
		}
		fatal(t, "claim after the password changed", err)
	})
}

// TestClientLogsThroughSlog: go-redis's own lines (a dial that failed)
// reach the store's logger, not stderr beside it.
func TestClientLogsThroughSlog(t *testing.T) {
	var buf testenv.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	url := fmt.Sprintf("redis://127.0.0.1:%d/0?dial_timeout=200ms", freePort(t))
	if _, err := Open(context.Background(), url, Options{Logger: log}); !errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("open with nothing listening: %v, want ErrUnavailable", err)
	}
	if out := buf.String(); !strings.Contains(out, "level=DEBUG msg=\"redis client\"") || !strings.Contains(out, "failed to dial") {
		t.Fatalf("the store's log holds %q, want go-redis's failed dial at debug level", out)
	}
}

// TestClassifyOnce: an error told apart already keeps its message, so a
// claim on a server whose replicas lag says "unavailable" once.
func TestClassifyOnce(t *testing.T) {
	for _, err := range []error{
		fmt.Errorf("%w: %w (1 of 2)", dedup.ErrUnavailable, errFewReplicas),
		redisconn.Classify(errors.New("connection refused")),
		fmt.Errorf("%w: WRONGPASS", dedup.ErrFatal),
	} {
		if got := redisconn.Classify(err); got.Error() != err.Error() {
			t.Errorf("classify(%q) = %q, want it as it was", err, got)
		}
	}
}
