package pipeline_test

import (
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/consumer"
	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
)

// Config.Validate fills the policy's defaults and the pipeline's own from
// them, and refuses what cannot work; a bad policy is refused with the
// words the consumer uses for it, since one Validate checks both.
func TestConfigValidate(t *testing.T) {
	c := pipeline.Config{Policy: dedup.Policy{IDAttribute: "event_id"}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.Horizon != dedup.DefaultHorizon || c.Lease != dedup.DefaultLease || c.WriteTimeout != dedup.DefaultLease/2 ||
		c.OutputIDAttribute != "event_id" || c.AuditSaveEvery != pipeline.DefaultAuditSaveEvery {
		t.Fatalf("defaults not filled: %+v", c)
	}
	for _, tc := range []struct {
		name string
		cfg  pipeline.Config
		err  string
	}{
		{"write timeout past the lease", pipeline.Config{Policy: dedup.Policy{Lease: 10 * time.Second}, WriteTimeout: 10 * time.Second},
			"write timeout 10s must be shorter than the claim lease 10s"},
		{"audit within the horizon", pipeline.Config{Policy: dedup.Policy{Horizon: time.Hour}, Audit: audit.Options{Horizon: time.Hour}},
			"audit horizon 1h0m0s must be longer than the dedup horizon 1h0m0s"},
		{"bad policy", pipeline.Config{Policy: dedup.Policy{Missing: dedup.Reject}}, "needs an IDAttribute"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("Validate() = %v, want %q", err, tc.err)
			}
		})
	}
	bad := dedup.Policy{Horizon: 500 * time.Millisecond}
	pc, co := pipeline.Config{Policy: bad}, consumer.Options{Policy: bad}
	perr, cerr := pc.Validate(), co.Validate()
	if perr == nil || cerr == nil || !strings.HasSuffix(cerr.Error(), ": "+perr.Error()) {
		t.Fatalf("pipeline: %v; consumer: %v; want the same reason", perr, cerr)
	}
}
