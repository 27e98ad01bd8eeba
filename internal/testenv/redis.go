package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis is a redis-server of a test's own, on a free loopback port, without
// persistence unless args ask for it, killed at the end of the test. It is
// the one way tests start one: a store's tests, an outage, a cluster.
type Redis struct {
	Port int
	Dir  string // its working folder: the AOF, nodes.conf, redis.log

	t    testing.TB
	bin  string
	args []string
	cmd  *exec.Cmd
}

// StartRedis starts redis-server (RedisServer) with args after the defaults
// and waits until it answers PING.
func StartRedis(t testing.TB, args ...string) *Redis {
	t.Helper()
	bin := RedisServer(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	dir := t.TempDir()
	r := &Redis{Port: port, Dir: dir, t: t, bin: bin, args: append([]string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"), "--daemonize", "no"}, args...)}
	r.Start()
	t.Cleanup(r.Kill)
	return r
}

// Addr is host:port.
func (r *Redis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// URL is a redis:// URL of database 0.
func (r *Redis) URL() string { return "redis://" + r.Addr() + "/0" }

// Start starts the server again after Kill, on the same port, folder and
// arguments, and waits until it answers PING (after loading its AOF, if any).
func (r *Redis) Start() {
	r.t.Helper()
	r.cmd = exec.Command(r.bin, r.args...)
	if err := r.cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(r.Addr())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(filepath.Join(r.Dir, "redis.log"))
			r.t.Fatalf("redis-server %v did not answer within 10 s: %v\n%s", r.args, err, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (r *Redis) Kill() {
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Signal sends sig to the server, e.g. SIGSTOP and SIGCONT for a server
// that hangs without closing its connections.
func (r *Redis) Signal(sig os.Signal) error {
	if r.cmd == nil {
		return fmt.Errorf("redis-server on %d is not running", r.Port)
	}
	return r.cmd.Process.Signal(sig)
}

// ping sends PING in RESP and wants +PONG: a server still loading its data
// answers -LOADING.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	// A server with requirepass answers -NOAUTH: it is up all the same.
	if line != "+PONG\r\n" && !strings.HasPrefix(line, "-NOAUTH") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}
