package testenv

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ProcessCPU is a running process's user+system CPU time so far, from
// /proc/PID/stat (Linux): benchmarks read the servers and pipelines they
// start this way, since Wait accounts a child's CPU only once it has ended.
func ProcessCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("read process CPU: %w", err)
	}
	// The command name (field 2) may hold spaces: count fields after ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, fmt.Errorf("read process CPU: /proc/%d/stat has no command name", pid)
	}
	f := strings.Fields(string(b)[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("read process CPU: /proc/%d/stat has %d fields", pid, len(f))
	}
	var ticks int64
	for _, s := range f[11:13] { // utime, stime: fields 14 and 15 of stat(5)
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("read process CPU: %w", err)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// the benchmarks run on (it is fixed in the kernel's ABI for x86 and arm64).
const clockTicks = 100
