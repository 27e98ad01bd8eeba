package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/internal/advice"
	"github.com/dedupflow/dedupflow/internal/metricpage"
)

// runAdvise prints horizon advice from a running pipeline's metrics.
func runAdvise(ctx context.Context, args []string, stdout, stderr io.Writer) (err error) {
	var (
		metrics string
		asJSON  bool
	)
	fs := newFlags("advise", stderr)
	defer func() { err = envNamed(fs, err) }()
	fs.StringVar(&metrics, "metrics", "http://127.0.0.1:9464/metrics", "the /metrics URL of a running dedupflow pipeline (its --metrics-addr)")
	fs.BoolVar(&asJSON, "json", false, "print the advice and its basis as JSON")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "usage: dedupflow advise [--metrics URL] [--json]\n\n"+
			"Tells how long the horizon has to be, from the delays of the republished copies a running pipeline saw.\n\n")
		fs.PrintDefaults()
	}
	if err := parse(fs, args); err != nil {
		return err
	}
	u, err := url.Parse(metrics)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--metrics %q: want an http:// URL such as http://127.0.0.1:9464/metrics", metrics)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = "/metrics"
	}
	mfs, err := metricpage.Families(ctx, http.DefaultClient, u.String())
	if err != nil {
		// The console's address is the one a user of up knows, and the wrong one.
		return fmt.Errorf("%w; --metrics wants the pipeline's --metrics-addr (default 127.0.0.1:9464), not the console's address", err)
	}
	a := advice.From(mfs, time.Now())
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(a)
	}
	_, err = fmt.Fprintln(stdout, a.Text)
	return err
}

// adviceHandler serves /advice: the same advice as JSON, from reg.
func adviceHandler(reg prometheus.Gatherer) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		mfs, err := reg.Gather()
		if err != nil {
			http.Error(w, "gather metrics: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(advice.From(mfs, time.Now()))
	}
}
