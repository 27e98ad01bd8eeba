package disk

// The store's folder, checked before Pebble opens it: a folder of other
// files, one the process cannot write, one another process holds, and
// what to do about corrupt files.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// errCorrupt says what to do about a store whose files are damaged.
var errCorrupt = errors.New("its files are corrupt: restore the folder from a backup, " +
	"or move it aside and start with an empty horizon (copies of keys seen before then pass once)")

// advise adds errCorrupt to a corruption error.
func advise(err error) error {
	if pebble.IsCorruptionError(err) {
		return fmt.Errorf("%w (%w)", errCorrupt, err)
	}
	return err
}

// checkFolder refuses a folder that holds files but no store: Pebble
// would write its files among them, and a typo in --state could put a
// store in someone's home folder.
func checkFolder(path string) error {
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil // none yet, or a file: MkdirAll says which
	}
	var other []string
	for _, e := range entries {
		n := e.Name()
		switch {
		case n == "CURRENT", strings.HasPrefix(n, "MANIFEST-"), strings.HasPrefix(n, "marker.manifest."):
			return nil
		case n == "LOCK", strings.HasPrefix(n, writeCheck): // left by an open that failed
		default:
			other = append(other, n)
		}
	}
	if len(other) == 0 {
		return nil
	}
	return fmt.Errorf("open disk store %s: the folder holds %d other files (%s) and no disk store; "+
		"give a new or empty folder for the store", path, len(other), strings.Join(other[:min(3, len(other))], ", "))
}

// writeCheck starts the name of the file checkWritable creates.
const writeCheck = ".write-check-"

// checkWritable creates and removes a file in the folder: Pebble opened
// on a folder it cannot write retries its background writes forever,
// logging each failure, and never returns.
func checkWritable(path string) error {
	f, err := os.CreateTemp(path, writeCheck+"*")
	if err != nil {
		return fmt.Errorf("open disk store %s: the store needs write access to its folder, as user %d: %w "+
			"(give this user write access to it, or use another folder)", path, os.Geteuid(), errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// lockDir takes the directory's lock, waiting up to a second for another
// process to let go of it (a restart that overlaps the old process).
func lockDir(ctx context.Context, path string) (*pebble.Lock, error) {
	deadline := time.Now().Add(time.Second)
	for {
		l, err := pebble.LockDirectory(path, vfs.Default)
		if err == nil {
			return l, nil
		}
		held := errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) ||
			strings.Contains(err.Error(), "held by current process")
		if !held {
			return nil, fmt.Errorf("lock disk store %s: %w", path, err)
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("open disk store %s: another process holds it (%w)", path, err)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
