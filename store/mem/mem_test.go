package mem_test

import (
	"testing"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/store/mem"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) dedup.Store { return mem.New() })
}
