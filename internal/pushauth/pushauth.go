// Package pushauth verifies the OIDC token that Pub/Sub sends with each
// push of a subscription whose push_config has an oidc_token: without it
// anyone who reaches a push endpoint can hand it messages.
package pushauth

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// GoogleCerts are the keys Google signs push tokens with; the broker
// serves its own at the same path (broker.PushKeysPath).
const GoogleCerts = "https://www.googleapis.com/oauth2/v3/certs"

// issuer is the iss claim of Google's push tokens, and of the broker's.
const issuer = "https://accounts.google.com"

// Options say which tokens are good.
type Options struct {
	// JWKS is the URL of the signing keys; empty: GoogleCerts.
	JWKS string
	// Audience is the token's aud: the push_config's audience, by default
	// the push endpoint's URL.
	Audience string
	// ServiceAccount is the token's email: the push_config's service
	// account, which must be verified.
	ServiceAccount string
	// Client fetches the keys; nil: one with a 10 s timeout.
	Client *http.Client
	// Now is the clock expiry is checked against; nil: time.Now.
	Now func() time.Time
}

// New returns a check of a push request's bearer token (for
// consumer.Options.VerifyToken or pipeline.PushOptions.Verify). The keys
// are fetched when first needed and again for a key they lack, with ctx,
// which must last as long as the check is used.
func New(ctx context.Context, o Options) (func(ctx context.Context, token string) error, error) {
	if o.Audience == "" || o.ServiceAccount == "" {
		return nil, errors.New("pushauth: the audience and the service account are both required")
	}
	if o.JWKS == "" {
		o.JWKS = GoogleCerts
	}
	if o.Client == nil {
		o.Client = &http.Client{Timeout: 10 * time.Second}
	}
	keys := oidc.NewRemoteKeySet(oidc.ClientContext(ctx, o.Client), o.JWKS)
	v := oidc.NewVerifier(issuer, keys, &oidc.Config{ClientID: o.Audience, Now: o.Now})
	return func(ctx context.Context, token string) error {
		t, err := v.Verify(ctx, token)
		if err != nil {
			return err
		}
		var c struct {
			Email         string `json:"email"`
			EmailVerified bool   `json:"email_verified"`
		}
		if err := t.Claims(&c); err != nil {
			return err
		}
		if c.Email != o.ServiceAccount || !c.EmailVerified {
			return fmt.Errorf("token of service account %q (verified: %v), want %q", c.Email, c.EmailVerified, o.ServiceAccount)
		}
		return nil
	}, nil
}
