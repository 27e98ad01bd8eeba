package outcome_test

import (
	"testing"

	"github.com/dedupflow/dedupflow/outcome"
)

func TestAcked(t *testing.T) {
	for o, want := range map[outcome.Outcome]bool{
		outcome.Emitted: true, outcome.DuplicateRedelivery: true, outcome.DuplicateRepublish: true,
		outcome.DeadLettered: true, outcome.InFlightConflict: false, outcome.Retried: false,
	} {
		if o.Acked() != want {
			t.Errorf("%s.Acked() = %v, want %v", o, !want, want)
		}
	}
}
