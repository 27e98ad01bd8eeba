//go:build unix

package dedup

import (
	"syscall"
	"testing"
	"time"
)

// cpuPerOp reports the process's CPU time per operation beside ns/op: on
// a shared machine wall time per op grows with everyone else's load, CPU
// time much less. Call the returned function after the timed loop.
func cpuPerOp(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op") }
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
