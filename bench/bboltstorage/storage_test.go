package bboltstorage

import (
	"encoding/binary"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// The workload of the broker's BenchmarkStorage/log; change both together.
const (
	writers, perWriter = 64, 1000
	payloadSize        = 150
)

// BenchmarkStorage writes publish-sized records durably from many
// concurrent writers, then deletes each (an ack), through bbolt with
// db.Batch (bbolt's own group commit), which fsyncs before a write counts as
// done.
func BenchmarkStorage(b *testing.B) {
	payload := make([]byte, payloadSize)
	b.Run("bbolt", func(b *testing.B) {
		db, err := bolt.Open(filepath.Join(b.TempDir(), "bolt.db"), 0o644, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer db.Close()
		bucket := []byte("m")
		if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucketIfNotExists(bucket); return err }); err != nil {
			b.Fatal(err)
		}
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
