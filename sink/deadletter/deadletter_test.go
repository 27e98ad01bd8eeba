package deadletter

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/sink"
)

// TestDeadLetterFitsTheLimit: a dead letter is always a message Pub/Sub
// takes. Near the limit the reason is cut first; when even the data does
// not fit beside the attributes, the data is left out and its size said.
func TestDeadLetterFitsTheLimit(t *testing.T) {
	reason := errors.New("publish to projects/p/topics/out: retrying cannot help: message too large: 10000107 bytes, the limit is 10000000")
	for _, tc := range []struct {
		name       string
		data       int
		wantData   bool
		wantReason string // a prefix of the reason attribute
	}{
		{"small", 100, true, reason.Error()},
		{"reason cut", limits.MessageBytes - 100, true, "publish to projects/p/topics/out"},
		{"data dropped", limits.MessageBytes - 5, false, reason.Error() + "; its 9999995 bytes of data do not fit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &sink.Message{ID: "12345", Data: make([]byte, tc.data), Attributes: map[string]string{"key": "k1"}}
			dl := Of(m, reason)
			n, err := limits.Message(dl.Data, dl.Attributes, "")
			if err != nil {
				t.Fatalf("dead letter of %d bytes: %v", tc.data, err)
			}
			if got := len(dl.Data) == tc.data; got != tc.wantData {
				t.Errorf("data kept: %v, want %v (dead letter %d bytes)", got, tc.wantData, n)
			}
			if !strings.HasPrefix(dl.Attributes[AttrError], tc.wantReason) {
				t.Errorf("reason %q, want it to start %q", dl.Attributes[AttrError], tc.wantReason)
			}
			if dl.Attributes["key"] != "k1" || dl.Attributes[AttrSourceMessageID] != "12345" {
				t.Errorf("attributes %v: want the original's and the source message ID", dl.Attributes)
			}
			dropped, ok := dl.Attributes[AttrDataDropped]
			if ok != !tc.wantData || (ok && dropped != strconv.Itoa(tc.data)) {
				t.Errorf("%s=%q (set: %v), want the original size only when the data is dropped", AttrDataDropped, dropped, ok)
			}
		})
	}
}
