package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is one process the benchmark started: an emulator, a Redis server,
// a pipeline or Bento. It runs in its own process group so that stop also
// reaches what a launcher script forks (the emulator's launcher starts a
// JVM), and its output goes to a log file that failures quote.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // valid after done is closed
	once    sync.Once
}

// startChild starts bin with args in dir ("": ours) with extra environment
// variables; the caller owns the returned child and must call stop or kill.
func startChild(name, logPath, dir string, env []string, bin string, args ...string) (*child, error) {
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("create %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the process has ended, and how.
func (c *child) exited() (bool, error) {
	select {
	case <-c.done:
		return true, c.err
	default:
		return false, nil
	}
}

// stop asks the process group to end (SIGTERM), waits up to grace, then
// kills it. It returns the process's exit error when it ended on its own
// before stop was asked, or did not end cleanly on SIGTERM.
func (c *child) stop(grace time.Duration) error {
	var err error
	c.once.Do(func() {
		if done, werr := c.exited(); done {
			if werr != nil {
				err = fmt.Errorf("%s exited early: %w (log: %s)", c.name, werr, c.tail())
			}
			return
		}
		pgid := -c.cmd.Process.Pid
		_ = syscall.Kill(pgid, syscall.SIGTERM)
		t := time.NewTimer(grace)
		defer t.Stop()
		select {
		case <-c.done:
			var ee *exec.ExitError
			if c.err != nil && !(errors.As(c.err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()) {
				err = fmt.Errorf("%s did not stop cleanly: %w (log: %s)", c.name, c.err, c.tail())
			}
		case <-t.C:
			_ = syscall.Kill(pgid, syscall.SIGKILL)
			<-c.done
			err = fmt.Errorf("%s ignored SIGTERM for %v and was killed", c.name, grace)
		}
	})
	return err
}

// kill ends the process group at once, for cleanup paths where its exit
// status no longer matters.
func (c *child) kill() {
	c.once.Do(func() {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
		<-c.done
	})
}

// tail is the end of the child's log, for error messages.
func (c *child) tail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	s := strings.TrimSpace(string(b))
	if len(s) > 1500 {
		s = "…" + s[len(s)-1500:]
	}
	if s == "" {
		return "empty"
	}
	return s
}

// freePort asks the kernel for a free loopback port. Another process can
// take it before the child binds it; the child then fails to start and the
// error says so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitPort waits until something accepts connections on addr, the child
// exits, or timeout passes.
func waitPort(ctx context.Context, c *child, addr string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	for {
		conn, err := d.DialContext(ctx, "tcp", addr)
		if err == nil {
			conn.Close()
			return nil
		}
		if done, werr := c.exited(); done {
			return fmt.Errorf("%s exited before listening on %s: %v (log: %s)", c.name, addr, werr, c.tail())
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: nothing listens on %s after %v: %w", c.name, addr, timeout, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
