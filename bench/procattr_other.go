//go:build !linux

package main

import "syscall"

// childAttr puts a child in its own process group, so stop reaches what
// its launcher forks.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
