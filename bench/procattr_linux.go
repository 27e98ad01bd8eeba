package main

import "syscall"

// childAttr puts a child in its own process group (so stop reaches the
// JVM behind the emulator's launcher script) and has the kernel kill it if
// the benchmark itself dies without running its cleanup.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
