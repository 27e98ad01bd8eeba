package main

import (
	"errors"
	"fmt"
	"net"
	"syscall"
)

// checkPorts tries every address a command is about to listen on (flag
// name and host:port; empty is off), all at once so that one given
// twice conflicts too, and reports every one that cannot be had: failing
// on the first would leave the next conflict for the next try. A port
// taken between this check and the listen is still reported by the
// listen.
func checkPorts(addrs [][2]string) error {
	var errs []error
	var held []net.Listener
	defer func() {
		for _, ln := range held {
			ln.Close()
		}
	}()
	for _, fa := range addrs {
		flag, addr := fa[0], fa[1]
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			if errors.Is(err, syscall.EADDRINUSE) {
				err = fmt.Errorf("%w: another process listens there; pick another with %s", err, flag)
			}
			errs = append(errs, fmt.Errorf("%s %s: %w", flag, addr, err))
			continue
		}
		held = append(held, ln)
	}
	return errors.Join(errs...)
}
