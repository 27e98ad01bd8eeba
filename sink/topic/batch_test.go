package topic

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dedupflow/dedupflow/sink"
)

func batchOf(n int, attrs func(i int) map[string]string) []*sink.Message {
	ms := make([]*sink.Message, n)
	for i := range ms {
		a := map[string]string{"k": fmt.Sprint(i)}
		if attrs != nil {
			a = attrs(i)
		}
		ms[i] = &sink.Message{Data: []byte("x"), Attributes: a}
	}
	return ms
}

func TestWriteBatch(t *testing.T) {
	for _, server := range []string{"broker", "pstest"} {
		t.Run(server+": one request per 1,000 messages, each arrives once", func(t *testing.T) {
			r := newSinkRig(t, server)
			const n = 2500
			errs := make([]error, n)
			r.sink.WriteBatch(context.Background(), batchOf(n, nil), errs)
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			if reqs := r.requests.Load(); reqs != 3 {
				t.Errorf("a batch of %d took %d publish requests, want 3", n, reqs)
			}
			r.receivedOnce(t, n)
		})
	}

	t.Run("split by size: no request over 9 MB", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		ms := batchOf(3, nil)
		for _, m := range ms {
			m.Data = make([]byte, 4<<20)
		}
		errs := make([]error, len(ms))
		r.sink.WriteBatch(context.Background(), ms, errs)
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		if reqs := r.requests.Load(); reqs != 2 {
			t.Errorf("three 4 MiB messages took %d requests, want 2", reqs)
		}
	})

	t.Run("a refused message fails alone, as permanent", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		ms := batchOf(6, func(i int) map[string]string {
			a := map[string]string{"k": fmt.Sprint(i)}
			if i == 3 {
				a["v"] = strings.Repeat("x", 2000) // over the 1024-byte value limit
			}
			return a
		})
		errs := make([]error, len(ms))
		r.sink.WriteBatch(context.Background(), ms, errs)
		r.refusedAlone(t, errs)
	})

	t.Run("a server that does not answer fails every message, transient", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		r.neverAnswers()
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		errs := make([]error, 3)
		r.sink.WriteBatch(ctx, batchOf(3, nil), errs)
		for i, err := range errs {
			if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, sink.ErrPermanent) {
				t.Fatalf("message %d: %v, want a transient deadline error", i, err)
			}
		}
	})

	t.Run("stop waits for a batch in flight and refuses later ones", func(t *testing.T) {
		r := newSinkRig(t, "broker")
		release := r.holdFirst()
		errs := make([]error, 2)
		done := make(chan struct{})
		go func() { r.sink.WriteBatch(context.Background(), batchOf(2, nil), errs); close(done) }()
		<-r.holding
		stopped := make(chan struct{})
		go func() { r.sink.Stop(); close(stopped) }()
		select {
		case <-stopped:
			t.Fatal("Stop returned while a batch's request was in flight")
		case <-time.After(100 * time.Millisecond):
		}
		close(release)
		<-done
		<-stopped
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
		later := make([]error, 1)
		r.sink.WriteBatch(context.Background(), batchOf(1, nil), later)
		if !errors.Is(later[0], ErrStopped) {
			t.Fatalf("batch after Stop: %v, want ErrStopped", later[0])
		}
	})
}
