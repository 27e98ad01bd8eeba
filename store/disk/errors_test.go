package disk

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/dedupflow/dedupflow/dedup"
)

// TestWriteFailureIsFatal: once the disk refuses a write (here: it turned
// read-only under the store), Commit fails with an error that wraps
// dedup.ErrFatal and the cause, and so does every commit after it: Pebble
// cannot go on, only reopening heals the store.
func TestWriteFailureIsFatal(t *testing.T) {
	var readOnly atomic.Bool
	fs := errorfs.Wrap(vfs.Default, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if readOnly.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return fmt.Errorf("write %s: %w", op.Path, syscall.EROFS)
		}
		return nil
	}))
	path := filepath.Join(t.TempDir(), "db")
	s := open(t, path, Options{fs: fs})
	now := time.Now()
	commit(t, s, dedup.KeyOf("before"), "m", now.Add(time.Hour))

	readOnly.Store(true)
	for i := range 2 {
		err := s.Commit(context.Background(), dedup.KeyOf(fmt.Sprint("after", i)), "m", now.Add(time.Hour))
		if !errors.Is(err, dedup.ErrFatal) || !errors.Is(err, syscall.EROFS) || errors.Is(err, dedup.ErrUnavailable) {
			t.Fatalf("commit %d on a read-only disk: %v, want an error wrapping dedup.ErrFatal and EROFS", i, err)
		}
		// The store says what it knows: which store, and why; the caller
		// says which call and key.
		if want := "disk store " + path + ": unrecoverable error: write " + path + "/"; !strings.HasPrefix(err.Error(), want) {
			t.Fatalf("commit %d: %q, want it to start %q", i, err, want)
		}
	}
	s.Close()

	readOnly.Store(false)
	s = open(t, path, Options{})
	if v := claim(t, s, dedup.KeyOf("before"), "m", now); v.Status != dedup.Duplicate {
		t.Fatalf("the key committed before the failure, after reopening: %v, want duplicate", v.Status)
	}
}
