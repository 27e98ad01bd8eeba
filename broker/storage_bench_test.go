package broker

import (
	"context"
	"encoding/binary"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/broker/internal/logframe"
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
	// The workload of bench/bboltstorage's BenchmarkStorage; change both together.
	const writers, perWriter, payloadSize = 64, 1000, 150
	payload := make([]byte, payloadSize)
	b.Run("log", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "log"))
		if err != nil {
			b.Fatal(err)
		}
		w := newWAL(f, 0, false, defaultCompactSize, slog.New(slog.DiscardHandler))
		done := make(chan struct{})
		go func() { w.run(); close(done) }()
		var mu sync.Mutex // stands in for the broker's lock
		start := time.Now()
		var wg sync.WaitGroup
		for g := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWriter {
					mu.Lock()
					w.mu.Lock()
					s := len(w.buf)
					w.buf = append(logframe.Begin(w.buf), recPublish)
					w.buf = binary.AppendUvarint(w.buf, uint64(g*perWriter+i))
					w.buf = append(w.buf, payload...)
					w.finish(s)
					off := w.appended
					w.mu.Unlock()
					mu.Unlock()
					if err := w.wait(context.Background(), off); err != nil {
						b.Error(err)
						return
					}
					mu.Lock()
					w.mu.Lock()
					s = len(w.buf)
					w.buf = append(logframe.Begin(w.buf), recAck)
					w.buf = binary.AppendUvarint(w.buf, uint64(g*perWriter+i))
					w.finish(s)
					w.mu.Unlock()
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		w.mu.Lock()
		off := w.appended
		w.mu.Unlock()
		w.wait(context.Background(), off)
		el := time.Since(start)
		w.close()
		<-done
		f.Close()
		b.ReportMetric(float64(writers*perWriter)/el.Seconds(), "msgs/s")
	})
}
