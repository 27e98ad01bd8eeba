package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/sink"
	"github.com/dedupflow/dedupflow/store/mem"
)

type nopSink struct{}

func (nopSink) Write(context.Context, *sink.Message) error { return nil }

// fakeClock is a clock tests move by hand.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// A pipeline that caught 200 republished copies, each 2 s after its
// event's first copy: `dedupflow advise` reads its /metrics and says the
// 10m horizon caught them all within about 2 s, and /advice says the same
// as JSON.
func TestAdvise(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	reg := prometheus.NewRegistry()
	p, err := pipeline.New(pipeline.Config{Policy: dedup.Policy{IDAttribute: "event_id"}},
		pipeline.Deps{Store: mem.New(), Sink: nopSink{}, Registerer: reg, Now: clock.now})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		msg := func(id string) *pubsub.Message {
			return &pubsub.Message{ID: id, Data: []byte("x"), Attributes: map[string]string{"event_id": fmt.Sprint(i)}, PublishTime: clock.now()}
		}
		p.Handle(t.Context(), msg(fmt.Sprint("a", i)))
		clock.add(2 * time.Second)
		p.Handle(t.Context(), msg(fmt.Sprint("b", i)))
	}
	if c := p.Counts(); c.DuplicateRepublish != 200 {
		t.Fatalf("counts %+v", c)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/advice", adviceHandler(reg))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	var out, errs bytes.Buffer
	if err := runAdvise(t.Context(), []string{"--metrics", srv.URL}, &out, &errs); err != nil {
		t.Fatalf("advise: %v\n%s", err, errs.String())
	}
	text := out.String()
	if !strings.Contains(text, "your 10m horizon caught 200 republished copies") || !strings.Contains(text, "99.9% within ") {
		t.Errorf("advice %q", text)
	}
	resp, err := http.Get(srv.URL + "/advice")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var a struct {
		Caught   uint64  `json:"caught"`
		Needs999 float64 `json:"needs_999_seconds"`
		Horizon  float64 `json:"horizon_seconds"`
		Enough   bool    `json:"enough_data"`
		Text     string  `json:"text"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
		t.Fatal(err)
	}
	if !a.Enough || a.Caught != 200 || a.Horizon != 600 || a.Needs999 < 2 || a.Needs999 > 4 || strings.TrimSpace(text) != a.Text {
		t.Errorf("/advice %+v, want the same as advise", a)
	}
	if err := runAdvise(t.Context(), []string{"--metrics", "ftp://x"}, &out, &errs); err == nil || !strings.Contains(err.Error(), "http://") {
		t.Errorf("a non-http URL: %v", err)
	}
	// The console's address, which serves no /metrics, is named as not it.
	notFound := httptest.NewServer(http.NotFoundHandler())
	t.Cleanup(notFound.Close)
	if err := runAdvise(t.Context(), []string{"--metrics", notFound.URL + "/"}, &out, &errs); err == nil ||
		!strings.Contains(err.Error(), "404 Not Found") || !strings.Contains(err.Error(), "--metrics-addr (default 127.0.0.1:9464), not the console") {
		t.Errorf("a server without /metrics: %v", err)
	}
}
