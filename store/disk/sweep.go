package disk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// sweep reads the groups whose every record expired by now (expiry <= now,
// as a claim at now would find them expired), up to about limit records,
// starting where the last sweep stopped. Groups are ordered by their
// latest expiry, so it reads the expired ones and the first live one, no
// more. A group lives until its last record expires: the index judges each
// record by its own expiry, so the others only linger, by about the lease
// at most. The swept groups stay in the file until excise cuts them.
func (w *writer) sweep(now int64, limit int) (int, bool, error) {
	if now < w.nextExp {
		return 0, false, nil
	}
	lower := w.swept
	if lower == nil {
		lower = groupsLow
	}
	it, err := w.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: groupsEnd})
	if err != nil {
		return 0, false, err
	}
	swept := 0
	var last []byte
	more := false
	w.nextExp = 1<<63 - 1
	for ok := it.First(); ok; ok = it.Next() {
		w.examined.Add(1)
		k, v := it.Key(), it.Value()
		if groupExp(k) > now {
			w.nextExp = groupExp(k)
			break
		}
		if swept > 0 && swept+len(v)/recLen > limit {
			w.nextExp = groupExp(k)
			more = true
			break
		}
		w.unexcised += int64(len(v))
		swept += len(v) / recLen
		last = append(last[:0], k...)
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, false, err
	}
	if last != nil {
		w.swept = append(last, 0) // the key right after the last one swept
	}
	return swept, more, nil
}

// excise cuts the swept groups from the file once enough of them piled
// up. Pebble drops the tables wholly inside the range and narrows the one
// at its edge, with no compaction and no tombstone for later reads to step
// over (deletes at the front of a queue are what an LSM tree handles
// worst).
func (w *writer) excise(force bool) error {
	w.txMu.Lock()
	end := bytes.Clone(w.swept)
	due := w.unexcised > 0 && (force || w.unexcised >= exciseAfter || time.Since(w.lastExcise) >= exciseEvery)
	w.txMu.Unlock()
	if end == nil || !due {
		return nil
	}
	if err := w.db.Excise(context.Background(), pebble.KeyRange{Start: groupsLow, End: end}); err != nil {
		return fmt.Errorf("cut swept groups: %w", err)
	}
	w.txMu.Lock()
	w.unexcised, w.lastExcise = 0, time.Now()
	w.txMu.Unlock()
	return nil
}

// sweepAll sweeps everything that expired by now, one bounded sweep at a
// time.
func (w *writer) sweepAll(ctx context.Context, now int64) (int, error) {
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		w.txMu.Lock()
		w.nextExp = 0 // look, whatever the last sweep found
		swept, more, err := w.sweep(now, idleSweep)
		w.txMu.Unlock()
		if err != nil {
			return total, fmt.Errorf("sweep database %s: %w", w.path, err)
		}
		total += swept
		if !more {
			return total, w.excise(true)
		}
	}
}
