// Package localguard keeps web pages out of HTTP servers meant for the
// local machine (the console, the broker's REST API). Any page the user
// opens can send requests to a loopback port: a cross-site form post
// reaches it directly, and a page whose name is rebound to 127.0.0.1 (DNS
// rebinding) is even same-origin with itself. So a request is served only
// when its Host is loopback, an IP literal or a name the user allowed, and
// when neither Sec-Fetch-Site nor Origin shows another site.
package localguard

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Deny writes a refusal in the caller's own error format.
type Deny func(w http.ResponseWriter, r *http.Request, code int, msg string)

// HostAllowed reports whether host (a Host header, with or without a port)
// is localhost, an IP literal, or one of allowed (compared without case).
func HostAllowed(host string, allowed []string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") || net.ParseIP(host) != nil {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(host, a) {
			return true
		}
	}
	return false
}

// Host refuses, with 421 Misdirected Request, requests whose Host is not
// allowed by HostAllowed.
func Host(allowed []string, deny Deny, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !HostAllowed(r.Host, allowed) {
			deny(w, r, http.StatusMisdirectedRequest,
				fmt.Sprintf("host %q is not served here: use the server's IP address or localhost", r.Host))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// SameSite refuses, with 403 Forbidden, requests that a browser marks as
// coming from another site (Sec-Fetch-Site, else an Origin whose host is
// not the request's Host). With unsafeOnly, GET, HEAD and OPTIONS pass: a
// page's own links must open from anywhere, and the browser does not let
// another site read the answer. Command-line clients send neither header
// and pass.
func SameSite(unsafeOnly bool, deny Deny, h http.Handler) http.Handler {
	cop := http.NewCrossOriginProtection()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		check := r
		if !unsafeOnly {
			// CrossOriginProtection exempts safe methods; asked as a POST,
			// it judges every request.
			c := *r
			c.Method = http.MethodPost
			check = &c
		}
		if err := cop.Check(check); err != nil {
			deny(w, r, http.StatusForbidden, "cross-site request refused: "+err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})
}

// NewToken returns a random token for a page to send back with its
// requests (see Token).
func NewToken() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("make page token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Token refuses, with 403 Forbidden, requests whose X-CSRF-Token header is
// not token: only the page that embeds it can send one.
func Token(token string, deny Deny, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-CSRF-Token")), []byte(token)) != 1 {
			deny(w, r, http.StatusForbidden, "missing or stale page token: reload the page and try again")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// PageHeaders sets the headers every page of a local server sends: its
// Content-Security-Policy, and no sniffing, referrers or framing.
func PageHeaders(csp string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", csp)
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("X-Frame-Options", "DENY")
		h.ServeHTTP(w, r)
	})
}
