package postgres_test

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/sink/postgres"
	"github.com/jackc/pgx/v5"
)

// A server that cannot be reached is reported as the sink's outage, not the
// dedup store's, and is still transient: the pipeline backs off and retries.
func TestOpenUnreachableNamesTheSink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Port 1 on loopback: nothing listens, the dial is refused at once.
	_, err := postgres.Open(ctx, "postgres://nobody@127.0.0.1:1/db?sslmode=disable&connect_timeout=5", postgres.Options{})
	if err == nil {
		t.Fatal("open with nothing listening: no error")
	}
	if msg := err.Error(); strings.Contains(msg, "dedup store") || !strings.Contains(msg, "postgres sink unavailable") {
		t.Errorf("error %q: want it to say the postgres sink is unavailable, not the dedup store", msg)
	}
	if !errors.Is(err, postgres.ErrUnavailable) || !errors.Is(err, dedup.ErrUnavailable) {
		t.Errorf("error %v: want postgres.ErrUnavailable, matching dedup.ErrUnavailable", err)
	}
}

// A dropped table and refused credentials are errors that retrying cannot
// fix: they match dedup.ErrFatal, so the pipeline stops and exits non-zero
// instead of retrying forever (a restart creates the table again); an
// outage stays transient.
func TestRefusedIsFatal(t *testing.T) {
	e := newEnv(t)
	s := e.open(t, postgres.Options{})
	if err := s.Write(context.Background(), msg("a", "m1", "x")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.admin.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{e.table}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	err := s.Write(context.Background(), msg("b", "m2", "x"))
	if !errors.Is(err, dedup.ErrFatal) || !errors.Is(err, postgres.ErrRefused) || errors.Is(err, dedup.ErrUnavailable) {
		t.Fatalf("write to a dropped table: %v, want ErrRefused matching dedup.ErrFatal", err)
	}

	u, _ := url.Parse(e.url)
	u.User = url.UserPassword("no_such_role_"+e.app, "wrong")
	_, err = postgres.Open(context.Background(), u.String(), postgres.Options{Table: e.table})
	if !errors.Is(err, dedup.ErrFatal) {
		t.Fatalf("open with a role the server refuses: %v, want dedup.ErrFatal", err)
	}
}

// A connection URL that does not parse is refused naming what is wrong in
// it, and never with its password, even one pgx's masking misses (a raw
// '/' in it).
func TestOpenBadURLSaysWhatIsWrong(t *testing.T) {
	const pw = "s3cretPW"
	for _, tc := range []struct{ url, want string }{
		{"postgres://u:" + pw + "@127.0.0.1:notaport/db", "invalid port"},
		{"postgres://u:" + pw + "@127.0.0.1/db?sslmode=bogus", "sslmode is invalid"},
		{"postgres://u:" + pw + "%zz@127.0.0.1/db", "invalid percent-encoded token in password"},
		{"postgres://u:" + pw + "/x@127.0.0.1:5432/db", "invalid port"},
		{"host=127.0.0.1 password=" + pw + " port=notaport", "invalid port"},
	} {
		_, err := postgres.Open(context.Background(), tc.url, postgres.Options{})
		if err == nil || !strings.Contains(err.Error(), "cannot parse the connection URL: ") || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), pw) {
			t.Errorf("open %s: %v, want it to say %q and not the password", tc.url, err, tc.want)
		}
	}
}
