package localguard

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

func TestGuards(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	deny := func(w http.ResponseWriter, r *http.Request, code int, msg string) { http.Error(w, msg, code) }
	strict := Host([]string{"broker.internal"}, deny, SameSite(false, deny, ok))
	lax := Host(nil, deny, SameSite(true, deny, ok))
	for _, tc := range []struct {
		name    string
		h       http.Handler
		method  string
		host    string
		headers map[string]string
		want    int
	}{
		{"loopback IP", strict, "POST", "127.0.0.1:8085", nil, 204},
		{"IPv6 literal", strict, "POST", "[::1]:8085", nil, 204},
		{"LAN IP", strict, "POST", "192.168.1.20:8085", nil, 204},
		{"localhost with trailing dot", strict, "POST", "LOCALHOST.:8085", nil, 204},
		{"allowed name", strict, "GET", "Broker.Internal:8085", nil, 204},
		{"rebound name", strict, "GET", "evil.example:8085", nil, 421},
		{"rebound name, lax", lax, "GET", "evil.example", nil, 421},
		{"cross-site fetch", strict, "POST", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"cross-site GET, strict", strict, "GET", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403},
		{"cross-site GET, lax", lax, "GET", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "cross-site"}, 204},
		{"cross-site POST, lax", lax, "POST", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "same-site"}, 403},
		{"same origin", strict, "POST", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "same-origin"}, 204},
		{"typed by the user", strict, "GET", "127.0.0.1:8085", map[string]string{"Sec-Fetch-Site": "none"}, 204},
		{"foreign origin", strict, "DELETE", "127.0.0.1:8085", map[string]string{"Origin": "http://evil.example"}, 403},
		{"own origin", strict, "PUT", "127.0.0.1:8085", map[string]string{"Origin": "http://127.0.0.1:8085"}, 204},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(tc.method, "http://"+tc.host+"/v1/projects/p/topics/t", nil)
			r.Host = tc.host
			for k, v := range tc.headers {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			tc.h.ServeHTTP(w, r)
			if w.Code != tc.want {
				t.Fatalf("%s %s %v: got %d %q, want %d", tc.method, tc.host, tc.headers, w.Code, w.Body, tc.want)
			}
		})
	}
}
