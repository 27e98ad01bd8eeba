package broker

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dedupflow/dedupflow/broker/internal/logframe"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// BenchmarkStorage is the measurement behind the choice of storage (see the
// package documentation): durable writes of publish-sized records from many
// concurrent writers, then one delete (ack) per record, through this
// package's log with group commit, which fsyncs before a write counts as
// done. BenchmarkStorage/bbolt in bench/bboltstorage runs the same workload
// through bbolt (a module of its own, so that bbolt stays out of this one's
// go.mod); from the repository's root (go.work), both at once:
//
//	go test -run '^$' -bench Storage -benchtime 1x ./broker ./bench/bboltstorage
func BenchmarkStorage(b *testing.B) {
	b.Run("log", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "log"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		w := newWAL(f, 0, false, defaultCompactSize, slog.New(slog.DiscardHandler))
		done := make(chan struct{})
		go func() { w.run(); close(done) }()
		defer func() { w.close(); <-done }()
		var mu sync.Mutex // stands in for the broker's lock
		// appendRecord appends one record as the broker does, under its
		// lock, and returns the log's offset after it.
		appendRecord := func(kind byte, id uint64, payload []byte) uint64 {
			mu.Lock()
			defer mu.Unlock()
			w.mu.Lock()
			defer w.mu.Unlock()
			s := len(w.buf)
			w.buf = append(logframe.Begin(w.buf), kind)
			w.buf = binary.AppendUvarint(w.buf, id)
			w.buf = append(w.buf, payload...)
			w.finish(s)
			return w.appended
		}
		testenv.RunStorage(b,
			func(id uint64, payload []byte) error {
				return w.wait(context.Background(), appendRecord(recPublish, id, payload))
			},
			func(id uint64) { appendRecord(recAck, id, nil) },
			func() {
				w.mu.Lock()
				off := w.appended
				w.mu.Unlock()
				w.wait(context.Background(), off)
			})
	})
}
