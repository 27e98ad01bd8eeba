//go:build !unix

package testenv

import (
	"testing"
	"time"
)

// CPUTime is 0: the process's CPU time is read only on Unix.
func CPUTime() time.Duration { return 0 }

// CPUPerOp reports nothing: the process's CPU time is read only on Unix.
func CPUPerOp(*testing.B) func() { return func() {} }
