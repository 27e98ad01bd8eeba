package pushauth

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/golang-jwt/jwt/v5"
)

// TestVerify: a push token is good only when signed by a key of the set,
// by Google's issuer, for the audience, of the verified service account
// and not expired.
func TestVerify(t *testing.T) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	other, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keys := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "k1", Algorithm: "RS256", Use: "sig"}}})
	}))
	defer keys.Close()
	now := time.Unix(1_800_000_000, 0)
	const aud, sa = "https://dedup.example/push", "pusher@p.iam.gserviceaccount.com"
	verify, err := New(context.Background(), Options{JWKS: keys.URL, Audience: aud, ServiceAccount: sa, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	sign := func(k *rsa.PrivateKey, edit func(jwt.MapClaims)) string {
		c := jwt.MapClaims{"iss": issuer, "aud": aud, "email": sa, "email_verified": true,
			"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()}
		if edit != nil {
			edit(c)
		}
		tok := jwt.NewWithClaims(jwt.SigningMethodRS256, c)
		tok.Header["kid"] = "k1"
		s, err := tok.SignedString(k)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := verify(context.Background(), sign(key, nil)); err != nil {
		t.Errorf("good token refused: %v", err)
	}
	for name, tok := range map[string]string{
		"another key":             sign(other, nil),
		"another audience":        sign(key, func(c jwt.MapClaims) { c["aud"] = "https://other.example/" }),
		"another service account": sign(key, func(c jwt.MapClaims) { c["email"] = "intruder@p.iam.gserviceaccount.com" }),
		"unverified email":        sign(key, func(c jwt.MapClaims) { c["email_verified"] = false }),
		"another issuer":          sign(key, func(c jwt.MapClaims) { c["iss"] = "https://evil.example" }),
		"expired":                 sign(key, func(c jwt.MapClaims) { c["exp"] = now.Add(-time.Minute).Unix() }),
		"not a token":             "not.a.token",
	} {
		if err := verify(context.Background(), tok); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := New(context.Background(), Options{Audience: aud}); err == nil {
		t.Error("New without a service account: no error")
	}
}
