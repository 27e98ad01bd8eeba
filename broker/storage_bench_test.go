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
	bolt "go.etcd.io/bbolt"
)

// BenchmarkStorage is the measurement behind the choice of storage (see the
// package documentation): durable writes of publish-sized records from many
// concurrent writers, then one delete (ack) per record, through this
// package's log with group commit and through bbolt with db.Batch (bbolt's
// own group commit). Both fsync before a write counts as done.
//
//	go test -run '^$' -bench Storage -benchtime 1x ./broker
func BenchmarkStorage(b *testing.B) {
	const writers, perWriter = 64, 1000
	payload := make([]byte, 150)
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
	b.Run("bbolt", func(b *testing.B) {
		db, err := bolt.Open(filepath.Join(b.TempDir(), "bolt.db"), 0o644, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		bucket := []byte("m")
		db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err })
		start := time.Now()
		var wg sync.WaitGroup
		for g := range writers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range perWriter {
					key := binary.BigEndian.AppendUint64(nil, uint64(g*perWriter+i))
					if err := db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(key, payload) }); err != nil {
						b.Error(err)
						return
					}
					// Acks do not wait for durability in the broker either.
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete(key) }); err != nil {
							b.Error(err)
						}
					}()
				}
			}()
		}
		wg.Wait()
		b.ReportMetric(float64(writers*perWriter)/time.Since(start).Seconds(), "msgs/s")
	})
}
