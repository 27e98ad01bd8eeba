package console

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/pipeline"
)

// Row is one message that reached the output topic, as the live view shows
// it.
type Row struct {
	Seq       uint64 `json:"seq"`
	Data      string `json:"data"`
	Binary    bool   `json:"binary,omitempty"` // Data is a summary: the payload is not UTF-8
	Key       string `json:"key"`
	KeyFromID bool   `json:"key_from_id,omitempty"` // published without a key: the pipeline fell back to the message ID
	MessageID string `json:"message_id"`
	EventTime string `json:"event_time"` // RFC 3339, milliseconds
	// EventTimeFrom says where EventTime came from: "attribute" or
	// "publish time" (of the output, when the input carried no event time).
	EventTimeFrom string `json:"event_time_from"`
	// Submission identifies the console submission the row came from, so
	// it can be redelivered; 0 for messages published by someone else.
	Submission uint64 `json:"submission,omitempty"`
}

// feed keeps the latest rows for the live view and wakes its readers when a
// row arrives. Readers poll with since rather than each owning a channel, so
// a slow browser never blocks the output subscription and nothing needs
// unregistering.
type feed struct {
	mu      sync.Mutex
	rows    []Row // the newest max rows, oldest first
	max     int
	next    uint64
	changed chan struct{} // closed and replaced on every add
}

func newFeed(max int) *feed {
	return &feed{max: max, next: 1, changed: make(chan struct{})}
}

func (f *feed) add(r Row) Row {
	f.mu.Lock()
	defer f.mu.Unlock()
	r.Seq = f.next
	f.next++
	if len(f.rows) == f.max {
		copy(f.rows, f.rows[1:])
		f.rows = f.rows[:f.max-1]
	}
	f.rows = append(f.rows, r)
	close(f.changed)
	f.changed = make(chan struct{})
	return r
}

// since returns the rows after seq still held, and a channel closed when
// another row arrives.
func (f *feed) since(seq uint64) ([]Row, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []Row
	for _, r := range f.rows {
		if r.Seq > seq {
			out = append(out, r)
		}
	}
	return out, f.changed
}

// submission is one press of Publish: a message and its copies.
type submission struct {
	id   uint64
	at   time.Time     // taken before the first copy was published; also its event time
	key  string        // empty: published without a key
	ids  []string      // message IDs of the copies, in publish order; set by finish
	done chan struct{} // closed by finish, after which ids does not change
}

// submissions remembers what this console published, so an output row can
// be traced back to its input and the pipeline's subscription sought to
// just before it. Copies share their key and event time, as a publisher's
// retries of one event do; that pair identifies the submission on outputs.
type submissions struct {
	mu      sync.Mutex
	next    uint64
	byID    map[uint64]*submission
	byMark  map[string]*submission // mark(key or message ID, event time)
	order   []uint64               // oldest first, to forget beyond max
	pending map[*submission]bool   // begun, not finished
	max     int
}

func newSubmissions(max int) *submissions {
	return &submissions{
		next: 1, max: max,
		byID: map[uint64]*submission{}, byMark: map[string]*submission{}, pending: map[*submission]bool{},
	}
}

func mark(key string, at time.Time) string {
	return strconv.FormatInt(at.UnixMilli(), 10) + "\x00" + key
}

// begin registers a submission before its first copy is published: the
// pipeline may emit it before this console hears back from Publish.
func (s *submissions) begin(at time.Time, key string) *submission {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub := &submission{id: s.next, at: at, key: key, done: make(chan struct{})}
	s.next++
	s.byID[sub.id] = sub
	if key != "" {
		s.byMark[mark(key, at)] = sub
	}
	s.pending[sub] = true
	s.order = append(s.order, sub.id)
	if len(s.order) > s.max {
		s.forget(s.byID[s.order[0]])
	}
	return sub
}

// finish records the message IDs the copies got; a submission none of
// whose copies was published is forgotten.
func (s *submissions) finish(sub *submission, ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	defer close(sub.done)
	sub.ids = ids
	delete(s.pending, sub)
	if s.byID[sub.id] != sub {
		return // already forgotten
	}
	if len(ids) == 0 {
		s.forget(sub)
		return
	}
	for _, m := range s.marks(sub) {
		s.byMark[m] = sub
	}
}

func (s *submissions) forget(sub *submission) {
	delete(s.byID, sub.id)
	for _, m := range s.marks(sub) {
		if s.byMark[m] == sub {
			delete(s.byMark, m)
		}
	}
	if i := slices.Index(s.order, sub.id); i >= 0 {
		s.order = slices.Delete(s.order, i, i+1)
	}
}

// marks are how outputs of sub can be recognised: by its key, or, without
// one, by any copy's message ID, which the pipeline then uses as the key
// (in the message-ID namespace, dedup.MessageIDKey).
func (s *submissions) marks(sub *submission) []string {
	if sub.key != "" {
		return []string{mark(sub.key, sub.at)}
	}
	out := make([]string, len(sub.ids))
	for i, id := range sub.ids {
		out[i] = mark(dedup.MessageIDKey(id), sub.at)
	}
	return out
}

// lookup finds the submission an output came from. A keyless one is known
// by its message IDs only once its publishing is finished, so a miss waits
// for the submissions still publishing with the same event time.
func (s *submissions) lookup(ctx context.Context, key string, at time.Time) *submission {
	s.mu.Lock()
	sub := s.byMark[mark(key, at)]
	var wait []chan struct{}
	if sub == nil {
		for p := range s.pending {
			if p.at.Equal(at) {
				wait = append(wait, p.done)
			}
		}
	}
	s.mu.Unlock()
	if len(wait) == 0 {
		return sub
	}
	for _, d := range wait {
		select {
		case <-d:
		case <-ctx.Done():
			return nil
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byMark[mark(key, at)]
}

func (s *submissions) get(id uint64) *submission {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byID[id]
}

// after counts the messages this console published at or after t.
func (s *submissions) after(t time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sub := range s.byID {
		if !sub.at.Before(t) {
			n += len(sub.ids)
		}
	}
	return n
}

// counts is the live view's copy of pipeline.Counts, named for the page.
type counts struct {
	Received     int64  `json:"received"`
	Emitted      int64  `json:"emitted"`
	Redelivery   int64  `json:"redelivery"`
	Republish    int64  `json:"republish"`
	MissingKey   int64  `json:"missing_key"`
	DeadLettered int64  `json:"dead_lettered"`
	InFlight     int64  `json:"in_flight"` // nacked: another copy of the key was being written
	Retried      int64  `json:"retried"`
	Advice       string `json:"advice"` // how long the horizon has to be, from the copies seen
}

func countsView(c pipeline.Counts, advice string) counts {
	return counts{Advice: advice,
		Received: c.Received, Emitted: c.Emitted,
		Redelivery: c.DuplicateRedelivery, Republish: c.DuplicateRepublish,
		MissingKey: c.MissingID, DeadLettered: c.DeadLettered,
		InFlight: c.InFlightConflict, Retried: c.Retried,
	}
}

// advice is the pipeline's horizon advice, or "" without it.
func (c *Console) advice() string {
	if c.o.Advice == nil {
		return ""
	}
	return c.o.Advice()
}
