package testenv

import (
	"bytes"
	"sync"
)

// Buffer is an io.Writer that a test reads while the code under test
// writes to it from other goroutines (logs, a command's output).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
