package bboltstorage

import (
	"encoding/binary"
	"path/filepath"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// BenchmarkStorage runs the workload of the broker's BenchmarkStorage/log
// (testenv.RunStorage) through bbolt with db.Batch (bbolt's own group
// commit), which fsyncs before a write counts as done.
func BenchmarkStorage(b *testing.B) {
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
		key := func(id uint64) []byte { return binary.BigEndian.AppendUint64(nil, id) }
		var acks sync.WaitGroup
		testenv.RunStorage(b,
			func(id uint64, payload []byte) error {
				return db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Put(key(id), payload) })
			},
			// Acks do not wait for durability in the broker either.
			func(id uint64) {
				acks.Go(func() {
					if err := db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(bucket).Delete(key(id)) }); err != nil {
						b.Error(err)
					}
				})
			},
			acks.Wait)
	})
}
