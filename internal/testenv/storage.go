package testenv

import (
	"sync"
	"testing"
	"time"
)

// The workload of the broker's storage comparison: the broker's
// BenchmarkStorage/log and bench/bboltstorage's BenchmarkStorage/bbolt both
// run it through RunStorage, so the two measure the same thing.
const (
	storageWriters = 64
	storageRecords = 1000 // per writer
	storagePayload = 150  // bytes, a small publish
)

// RunStorage writes publish-sized records from many concurrent writers,
// each writer waiting until its record is durable (write) before it deletes
// it (ack, which need not wait for durability, as a broker's acks do not),
// then waits for what the acks left in flight (settle), and reports msgs/s.
func RunStorage(b *testing.B, write func(id uint64, payload []byte) error, ack func(id uint64), settle func()) {
	payload := make([]byte, storagePayload)
	start := time.Now()
	var wg sync.WaitGroup
	for g := range storageWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range storageRecords {
				id := uint64(g*storageRecords + i)
				if err := write(id, payload); err != nil {
					b.Error(err)
					return
				}
				ack(id)
			}
		}()
	}
	wg.Wait()
	settle()
	b.ReportMetric(float64(storageWriters*storageRecords)/time.Since(start).Seconds(), "msgs/s")
}
