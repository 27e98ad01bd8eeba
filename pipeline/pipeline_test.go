package pipeline_test

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/api/option"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/testenv"
	"github.com/dedupflow/dedupflow/pipeline"
	"github.com/dedupflow/dedupflow/pubsubio"
)

// seed acts out the tutorial: Message 1 with key 123, then Messages 2, 3
// and 4 with key 456; only Message 1 and Message 2 come through.
func seed(t *testing.T, conn []option.ClientOption) {
	r := newRig(t, conn, rigOpts{cfg: pipeline.Config{Policy: dedup.Policy{IDAttribute: "key"}}})
	r.start()
	r.publish("Message 1", map[string]string{"key": "123"})
	for i, m := range []string{"Message 2", "Message 3", "Message 4"} {
		r.publish(m, map[string]string{"key": "456"})
		// One at a time, so "the first of them" is well defined.
		r.waitCounts(m, func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish >= int64(i+2) })
	}
	c := r.waitCounts("all four", func(c pipeline.Counts) bool { return c.Emitted+c.DuplicateRepublish == 4 })
	out := r.drain(r.outSub, 2, 500*time.Millisecond)
	if d := datas(out); !slices.Equal(d, []string{"Message 1", "Message 2"}) {
		t.Fatalf("output %q, want exactly Message 1 and Message 2", d)
	}
	for _, m := range out {
		if m.attrs["key"] == "" {
			t.Errorf("%s lost its key attribute: %v", m.data, m.attrs)
		}
	}
	if c.Emitted != 2 || c.DuplicateRepublish != 2 || c.DuplicateRedelivery != 0 {
		t.Errorf("counts %+v, want 2 emitted and 2 republishes", c)
	}
}

func TestSeedScenarioPstest(t *testing.T) {
	_, conn := newPstest(t)
	seed(t, conn)
}

func TestSeedScenarioOfficialEmulator(t *testing.T) {
	seed(t, pubsubio.Insecure(testenv.EmulatorHost(t)))
}
