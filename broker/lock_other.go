//go:build !unix

package broker

import (
	"fmt"
	"os"
	"path/filepath"
)

// lockDir only creates the lock file where flock is not available; running
// two brokers on one data dir is then not detected.
func lockDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "LOCK"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("broker: open lock file: %w", err)
	}
	return f, nil
}
