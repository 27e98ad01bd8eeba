//go:build unix

package testenv

import (
	"syscall"
	"testing"
	"time"
)

// CPUTime is the CPU time (user and system) the process has used so far,
// or 0 if it cannot be read.
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// CPUPerOp reports the process's CPU time per operation beside ns/op, as
// cpu-ns/op: on a shared machine wall time per op grows with everyone
// else's load, CPU time much less. Call the returned function after the
// timed loop.
func CPUPerOp(b *testing.B) func() {
	start := CPUTime()
	return func() { b.ReportMetric(float64(CPUTime()-start)/float64(b.N), "cpu-ns/op") }
}
