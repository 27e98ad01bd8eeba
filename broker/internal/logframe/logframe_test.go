package logframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
)

func frames(payloads ...string) []byte {
	var log []byte
	for _, p := range payloads {
		log = Append(log, func(d []byte) []byte { return append(d, p...) })
	}
	return log
}

func scanAll(log []byte) (got []string, s *Scanner) {
	s = NewScanner(bytes.NewReader(log))
	for {
		p, ok := s.Next()
		if !ok {
			return got, s
		}
		got = append(got, string(p))
	}
}

// TestScanner reads logs that end cleanly and logs whose last frame a crash
// cut short or damaged: every intact frame is read, and Offset is where
// the intact part ends, which the broker cuts the file to.
func TestScanner(t *testing.T) {
	good := frames("one", "two", "three")
	corruptCRC := bytes.Clone(good)
	corruptCRC[len(corruptCRC)-1] ^= 1
	zeroLen := append(bytes.Clone(good), 0, 0, 0, 0, 0, 0, 0, 0, 'x')
	huge := binary.LittleEndian.AppendUint32(bytes.Clone(good), MaxLen+1)
	huge = append(huge, 0, 0, 0, 0)
	for _, tc := range []struct {
		name string
		log  []byte
		want []string
		end  int
		torn bool
	}{
		{"clean", good, []string{"one", "two", "three"}, len(good), false},
		{"empty", nil, nil, 0, false},
		{"header cut", good[:len(good)-len("three")-5], []string{"one", "two"}, len(frames("one", "two")), true},
		{"payload cut", good[:len(good)-2], []string{"one", "two"}, len(frames("one", "two")), true},
		{"checksum", corruptCRC, []string{"one", "two"}, len(frames("one", "two")), true},
		{"zero length", zeroLen, []string{"one", "two", "three"}, len(good), true},
		{"length too large", huge, []string{"one", "two", "three"}, len(good), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, s := scanAll(tc.log)
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || s.Offset() != int64(tc.end) {
				t.Errorf("read %q up to %d, want %q up to %d", got, s.Offset(), tc.want, tc.end)
			}
			if torn := s.Torn(); (torn != nil) != tc.torn || torn != nil && !errors.Is(torn, ErrTorn) {
				t.Errorf("Torn() = %v, want torn %v", torn, tc.torn)
			}
			if s.Err() != nil {
				t.Errorf("Err() = %v", s.Err())
			}
		})
	}
}

// TestDecoder reads back what the Append functions wrote, and sticks to the
// first error on a payload that ends too early.
func TestDecoder(t *testing.T) {
	p := binary.AppendUvarint(nil, 300)
	p = binary.AppendVarint(p, -7)
	p = AppendString(p, "topic")
	p = AppendBytes(p, []byte{1, 2})
	d := &Decoder{P: p}
	if u, v, s, b := d.Uvarint(), d.Varint(), d.Text(), d.Bytes(); u != 300 || v != -7 || s != "topic" || !bytes.Equal(b, []byte{1, 2}) || d.Err != nil || len(d.P) != 0 {
		t.Fatalf("decoded %d %d %q %v (err %v, %d left)", u, v, s, b, d.Err, len(d.P))
	}
	short := &Decoder{P: AppendString(nil, "topic")[:3]}
	if s := short.Text(); s != "" || !errors.Is(short.Err, ErrCorrupt) {
		t.Errorf("a cut string decodes as %q, %v; want ErrCorrupt", s, short.Err)
	}
	if v := short.Uvarint(); v != 0 || !errors.Is(short.Err, ErrCorrupt) {
		t.Errorf("after an error, Uvarint = %d, %v", v, short.Err)
	}
	if v := (&Decoder{}).Varint(); v != 0 {
		t.Errorf("Varint of nothing = %d", v)
	}
}
