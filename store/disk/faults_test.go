package disk

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
)

const faultChildEnv = "DEDUPFLOW_DISK_FAULT_CHILD"

// openAs opens the store at path in a child process, as user nobody when
// the test runs as root (root writes through any mode bits, as CI does), and
// returns what Open said and how long the child took. The child is given
// 30 s: a store that spins fails the test instead of hanging it.
func openAs(t *testing.T, path string, asNobody bool) (out string, took time.Duration) {
	t.Helper()
	bin := os.Args[0]
	cmd := exec.Command(bin, "-test.run=^TestFaultChild$")
	if asNobody {
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Fatalf("running as root needs a user nobody to open the store as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		// The test binary sits in a folder only root may enter: a copy
		// nobody can run.
		dir := t.TempDir()
		bin = filepath.Join(dir, "disk.test")
		copyFile(t, os.Args[0], bin, 0o755)
		// The test's temporary root (0700) holds both the copy and the
		// store: nobody must be able to pass through it.
		if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd = exec.Command(bin, "-test.run=^TestFaultChild$")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	}
	cmd.Env = append(os.Environ(), faultChildEnv+"="+path)
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("Open did not return within 30 s; it wrote %d bytes, ending:\n%s", buf.Len(), tail(buf.String(), 2000))
	}
	return buf.String(), time.Since(start)
}

func tail(s string, n int) string { return s[max(0, len(s)-n):] }

func copyFile(t *testing.T, from, to string, mode os.FileMode) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFaultChild is the child of openAs; it does nothing unless started by
// it. It prints Open's error, or "opened".
func TestFaultChild(t *testing.T) {
	path := os.Getenv(faultChildEnv)
	if path == "" {
		return
	}
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		os.Stdout.WriteString("open error: " + err.Error() + "\n")
		return
	}
	os.Stdout.WriteString("opened\n")
	s.Close()
}

// TestReadOnlyFolder: a store folder the process may not write (chmod
// 500, as after a deploy that changed the user) is refused at Open with
// one line that says so, at once, instead of Pebble retrying its
// background writes forever.
func TestReadOnlyFolder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(context.Background(), dedup.KeyOf("k"), "m", time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	root := os.Geteuid() == 0
	if root {
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Fatalf("running as root needs a user nobody: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		err = filepath.Walk(path, func(p string, _ os.FileInfo, err error) error {
			if err != nil {
				return err
			}
			return os.Chown(p, uid, gid)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(path, 0o500); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(path, 0o700) }) // so TempDir can remove it
	out, took := openAs(t, path, root)
	t.Logf("took %v: %s", took.Round(time.Millisecond), out)
	line, _, _ := strings.Cut(out, "\n")
	if !strings.HasPrefix(line, "open error: ") || !strings.Contains(line, path) || !strings.Contains(line, "permission denied") ||
		!strings.Contains(line, "write access") {
		t.Fatalf("Open of a read-only folder: %q, want one error naming the folder, permission denied and the write access it needs", tail(out, 2000))
	}
	if n := strings.Count(out, "\n"); n > 3 {
		t.Errorf("Open wrote %d lines, want only the error:\n%s", n, tail(out, 2000))
	}
}

// corruptStore makes a store with keys in a table file and a manifest,
// closed, and returns its path.
func corruptStore(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "db")
	s, err := Open(context.Background(), path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 2000 {
		if err := s.Commit(context.Background(), dedup.KeyOf(strconv.Itoa(i)), "m", now.Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.w.db.Flush(); err != nil { // into a table file
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// scribble overwrites the middle of the first file matching pattern in
// path with random bytes.
func scribble(t *testing.T, path, pattern string) string {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(path, pattern))
	if len(files) == 0 {
		t.Fatalf("no %s in %s", pattern, path)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, len(b)/2)
	rand.Read(junk)
	copy(b[len(b)/4:], junk)
	if err := os.WriteFile(files[0], b, 0o600); err != nil {
		t.Fatal(err)
	}
	return files[0]
}

// TestCorruptFiles: random bytes in a table file or the manifest are one
// readable error at Open that says what to do, never a panic.
func TestCorruptFiles(t *testing.T) {
	for _, pattern := range []string{"*.sst", "MANIFEST-*"} {
		t.Run(pattern, func(t *testing.T) {
			path := corruptStore(t)
			file := scribble(t, path, pattern)
			out, _ := openAs(t, path, false)
			t.Logf("%s", tail(out, 3000))
			line, _, _ := strings.Cut(out, "\n")
			if strings.Contains(out, "panic") || !strings.HasPrefix(line, "open error: ") {
				t.Fatalf("Open with a corrupt %s: %q, want one error, no panic", filepath.Base(file), tail(out, 3000))
			}
			for _, want := range []string{path, "corrupt", "restore the folder from a backup", "move it aside", "empty horizon"} {
				if !strings.Contains(line, want) {
					t.Errorf("error %q: want it to say %q", line, want)
				}
			}
		})
	}
}

// TestForeignFolder: a folder that holds other files is refused before the
// store writes anything into it; an empty folder and a store folder open.
func TestForeignFolder(t *testing.T) {
	home := t.TempDir()
	for _, f := range []string{"notes.txt", "photo.jpg"} {
		if err := os.WriteFile(filepath.Join(home, f), []byte("mine"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Open(context.Background(), home, Options{})
	if err == nil || !strings.Contains(err.Error(), "holds 2 other files (notes.txt, photo.jpg) and no disk store") {
		t.Fatalf("Open of a folder with other files: %v, want a refusal naming them", err)
	}
	if entries, _ := os.ReadDir(home); len(entries) != 2 {
		t.Fatalf("the refused folder holds %d files, want its own 2", len(entries))
	}
	empty := t.TempDir()
	s := open(t, empty, Options{})
	s.Close()
	open(t, empty, Options{}) // now a store folder
}
