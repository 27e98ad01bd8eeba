package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// stopGrace is how long a stopped command waits for the Pub/Sub client
// after its last message was done: time for the last acks to go out.
const stopGrace = 5 * time.Second

// newRegistry is a command's metrics registry, with the Go runtime's and
// the process's own metrics (goroutines, heap, resident memory, open
// files) beside the command's, as operators of any Go service expect.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// metricsMux serves /metrics from reg, /healthz, and /readyz answering 503
// with notReady while ready reports false.
func metricsMux(reg *prometheus.Registry, ready func() bool, notReady string) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			http.Error(w, notReady, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	return mux
}

// serveMetrics serves the pipeline's /metrics, /advice, /healthz and
// /readyz on addr until stop.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, ready func() bool, log *slog.Logger) (stop func(), err error) {
	mux := metricsMux(reg, ready, "not ready: the dedup store or the sink is unreachable")
	mux.HandleFunc("GET /advice", adviceHandler(reg))
	at, stop, err := serveHTTP(ctx, "--metrics-addr", addr, mux, log)
	if err != nil {
		return nil, err
	}
	log.Info("metrics and health", "url", "http://"+at+"/metrics")
	return stop, nil
}

// serveHTTP serves h on addr (named by flag in errors) until stop, which
// gives requests in progress 2 s to finish. at is the address it listens
// on, for a port 0.
func serveHTTP(ctx context.Context, flag, addr string, h http.Handler, log *slog.Logger) (at string, stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("%s %s: %w", flag, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("http server stopped", "flag", flag, "err", err)
		}
	}()
	return ln.Addr().String(), func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			srv.Close()
		}
		<-done
	}, nil
}
