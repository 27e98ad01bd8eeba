package testenv

import (
	"fmt"
	"os"
	"testing"
)

func TestProcessCPUReadsOwnProcess(t *testing.T) {
	// Burn a little CPU so the reading is above zero ticks.
	x := 0
	for i := range 50_000_000 {
		x += i % 7
	}
	d, err := ProcessCPU(os.Getpid())
	if err != nil {
		Missing(t, fmt.Sprintf("this test reads /proc, which is not here (%v)", err))
	}
	if d <= 0 || x < 0 {
		t.Fatalf("own CPU time %v after a busy loop", d)
	}
}
