package consumer_test

import (
	"bytes"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/store/mem"
)

// BenchmarkPush measures push requests per second through PushHandler
// (30% of them republished copies) against the bare net/http handler that
// does no dedup, in the same run: the cost of the dedup per request.
//
//	go test -run '^$' -bench Push ./consumer
func BenchmarkPush(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	dedup, err := consumer.PushHandler(mem.New(), consumer.Options{Policy: dedup.Policy{IDAttribute: "key"}}, ok)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare", ok}, {"dedup", dedup}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				// In each ten requests, seven events and three republished
				// copies of the first three (new message IDs, same keys).
				g, r := n/10, n%10
				if r >= 7 {
					r -= 7
				}
				body := pushBody(fmt.Sprint(n), "payload", map[string]string{"key": fmt.Sprint(g*10 + r)})
				c.h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body)))
				n++
			}
			b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
