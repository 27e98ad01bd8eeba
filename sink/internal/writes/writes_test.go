package writes

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/dedupflow/dedupflow/sink"
)

var errClosed = errors.New("closed")

// TestGuardClose: writes run until Close; after it every message of a
// batch gets the closed error and nothing is written; release runs once.
func TestGuardClose(t *testing.T) {
	var g Guard
	errs := make([]error, 2)
	ran := false
	g.Do(errs, errClosed, func() { ran = true })
	if !ran || errs[0] != nil || errs[1] != nil {
		t.Fatalf("open guard: ran %v, errs %v; want the write run and no errors", ran, errs)
	}
	released := 0
	g.Close(func() { released++ })
	g.Close(func() { released++ })
	ran = false
	g.Do(errs, errClosed, func() { ran = true })
	if ran || errs[0] != errClosed || errs[1] != errClosed || released != 1 {
		t.Fatalf("closed guard: ran %v, errs %v, released %d times; want no write, every error closed, one release", ran, errs, released)
	}
}

// TestGuardCloseWaits: Close waits for a write under way before it
// releases the client the write uses.
func TestGuardCloseWaits(t *testing.T) {
	var g Guard
	inWrite, closing := make(chan struct{}), make(chan struct{})
	writing := true
	done := make(chan struct{})
	go func() {
		defer close(done)
		g.Do(make([]error, 1), errClosed, func() {
			close(inWrite)
			<-closing
			writing = false
		})
	}()
	<-inWrite
	go close(closing)
	g.Close(func() {
		if writing {
			t.Error("released while a write was under way")
		}
	})
	<-done
}

// TestSplit: a batch is cut into requests within both limits, in order; a
// message that cannot be encoded fails alone, and one over the limits is a
// request of its own.
func TestSplit(t *testing.T) {
	var ms []*sink.Message
	for _, id := range []string{"a", "b", "bad", "c", "huge", "d", "e"} {
		ms = append(ms, &sink.Message{ID: id})
	}
	cost := map[string][2]int{"a": {2, 10}, "b": {2, 10}, "c": {2, 10}, "huge": {9, 10}, "d": {1, 60}, "e": {1, 50}}
	encode := func(m *sink.Message) (string, int, int, error) {
		if m.ID == "bad" {
			return "", 0, 0, fmt.Errorf("cannot encode %s", m.ID)
		}
		return m.ID, cost[m.ID][0], cost[m.ID][1], nil
	}
	var got [][]string
	var gotIdx [][]int
	errs := make([]error, len(ms))
	Split(ms, errs, Limits{Ops: 5, Bytes: 100}, encode, func(items []string, idx []int) {
		got = append(got, append([]string(nil), items...))
		gotIdx = append(gotIdx, append([]int(nil), idx...))
	})
	want := [][]string{{"a", "b"}, {"c"}, {"huge"}, {"d"}, {"e"}}
	wantIdx := [][]int{{0, 1}, {3}, {4}, {5}, {6}}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(gotIdx, wantIdx) {
		t.Errorf("requests %v at %v, want %v at %v", got, gotIdx, want, wantIdx)
	}
	for i, err := range errs {
		if (err != nil) != (ms[i].ID == "bad") {
			t.Errorf("message %s: %v", ms[i].ID, err)
		}
	}
}
