package broker

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"sync"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/golang-jwt/jwt/v5"
)

// Push subscriptions with an oidc_token send "Authorization: Bearer" with
// a JWT carrying the claims the service documents. Google's keys are not
// available here, so the broker signs with an RSA key of its own
// (Options.PushKey, or one generated on first use) and publishes the public
// half through PushPublicKey, PushKeySet and PushKeysHandler, and over HTTP
// at PushKeysPath, so that a handler under test verifies the token exactly
// as it would verify Google's, with another key set.
const (
	// PushTokenIssuer is the iss claim, as in Google's tokens, so that
	// handlers that check the issuer accept the broker's too.
	PushTokenIssuer = "https://accounts.google.com"
	pushTokenTTL    = time.Hour
	// A token is reused until this close to its expiry.
	pushTokenRenew = 5 * time.Minute
)

// signer holds the broker's push signing key, made once.
type signer struct {
	once sync.Once
	key  *rsa.PrivateKey
	kid  string
	err  error
}

func (b *Broker) signingKey() (*rsa.PrivateKey, string, error) {
	sg := &b.signer
	sg.once.Do(func() {
		sg.key = b.opts.PushKey
		if sg.key == nil {
			sg.key, sg.err = rsa.GenerateKey(rand.Reader, 2048)
			if sg.err != nil {
				sg.err = fmt.Errorf("broker: generate push signing key: %w", sg.err)
				return
			}
		}
		der, err := x509.MarshalPKIXPublicKey(&sg.key.PublicKey)
		if err != nil {
			sg.err = fmt.Errorf("broker: encode push signing key: %w", err)
			return
		}
		sum := sha256.Sum256(der)
		sg.kid = base64.RawURLEncoding.EncodeToString(sum[:16])
	})
	return sg.key, sg.kid, sg.err
}

// PushPublicKey returns the key that verifies the broker's push tokens and
// its key ID (the token header's kid).
func (b *Broker) PushPublicKey() (*rsa.PublicKey, string, error) {
	k, kid, err := b.signingKey()
	if err != nil {
		return nil, "", err
	}
	return &k.PublicKey, kid, nil
}

// PushKeySet returns the public key as a JSON Web Key Set (RFC 7517), the
// form in which Google publishes its own certificates.
func (b *Broker) PushKeySet() ([]byte, error) {
	k, kid, err := b.PushPublicKey()
	if err != nil {
		return nil, err
	}
	type jwk struct {
		Kty string `json:"kty"`
		Alg string `json:"alg"`
		Use string `json:"use"`
		Kid string `json:"kid"`
		N   string `json:"n"`
		E   string `json:"e"`
	}
	enc := base64.RawURLEncoding
	key := jwk{Kty: "RSA", Alg: "RS256", Use: "sig", Kid: kid,
		N: enc.EncodeToString(k.N.Bytes()), E: enc.EncodeToString(big.NewInt(int64(k.E)).Bytes())}
	return json.Marshal(struct {
		Keys []jwk `json:"keys"`
	}{[]jwk{key}})
}

// PushKeysPath is where the broker's HTTP port (the gRPC port, which also
// serves the REST API) serves PushKeySet: the path of Google's own
// certificates on www.googleapis.com, so a handler that takes the URL of
// its keys is pointed at http://HOST:PORT/oauth2/v3/certs.
const PushKeysPath = "/oauth2/v3/certs"

// withPushKeys serves GET PushKeysPath with PushKeysHandler, the rest with h.
func (b *Broker) withPushKeys(h http.Handler) http.Handler {
	keys := b.PushKeysHandler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == PushKeysPath && r.Method == http.MethodGet {
			keys.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// PushKeysHandler serves PushKeySet, for a handler that fetches its keys
// from a URL; the broker serves it at PushKeysPath, and it can be mounted
// anywhere else.
func (b *Broker) PushKeysHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		set, err := b.PushKeySet()
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(set)
	})
}

// pushClaims are the claims of Google's push tokens. sub and azp are the
// service account's numeric ID there; the broker has none and uses the
// email. aud is a single string, as in Google's tokens (the embedded
// registered claim would write an array).
type pushClaims struct {
	Audience      string `json:"aud"`
	Email         string `json:"email"`
	EmailVerified bool   `json:"email_verified"`
	Azp           string `json:"azp"`
	jwt.RegisteredClaims
}

// token returns a bearer token for o, reusing the last one until it is
// close to expiry. The audience defaults to the endpoint, as with the
// service.
func (p *pusher) token(o *pb.PushConfig_OidcToken, endpoint string) (string, error) {
	aud := o.Audience
	if aud == "" {
		aud = endpoint
	}
	now := p.b.now()
	p.tokMu.Lock()
	defer p.tokMu.Unlock()
	key := o.ServiceAccountEmail + "\x00" + aud
	if p.tok != "" && p.tokFor == key && now.Before(p.tokExp.Add(-pushTokenRenew)) {
		return p.tok, nil
	}
	tok, err := p.b.signPushToken(o.ServiceAccountEmail, aud, now)
	if err != nil {
		return "", err
	}
	p.tok, p.tokFor, p.tokExp = tok, key, now.Add(pushTokenTTL)
	return tok, nil
}

func (b *Broker) signPushToken(email, aud string, now time.Time) (string, error) {
	k, kid, err := b.signingKey()
	if err != nil {
		return "", err
	}
	t := jwt.NewWithClaims(jwt.SigningMethodRS256, pushClaims{
		Audience: aud, Email: email, EmailVerified: true, Azp: email,
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    PushTokenIssuer,
			Subject:   email,
			IssuedAt:  jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(pushTokenTTL)),
		},
	})
	t.Header["kid"] = kid
	s, err := t.SignedString(k)
	if err != nil {
		return "", fmt.Errorf("sign push token: %w", err)
	}
	return s, nil
}
