package wire

import (
	"maps"
	"strconv"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

type in struct {
	seq     uint64
	publish time.Time
	data    []byte
	attrs   map[string]string
	key     string
	ackID   uint64
	attempt int32
}

var ins = []in{
	{seq: 1, publish: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC), data: []byte("hello"),
		attrs: map[string]string{"a": "1", "empty": "", "": "no key"}, ackID: 1},
	{seq: 1 << 40, publish: time.Unix(0, 0), attrs: map[string]string{"only": "attrs"}, ackID: 1<<64 - 1, attempt: 3},
	{seq: 77, publish: time.Date(1960, 1, 1, 0, 0, 0, 5, time.UTC), data: make([]byte, 300), key: "k",
		ackID: 36 * 36, attempt: 1},
	{seq: 78, publish: time.Unix(1700000000, 0), data: []byte{0}, ackID: 5},
}

// TestBody: a body is the PubsubMessage fields it stands for, and Walk
// and Attr read them back.
func TestBody(t *testing.T) {
	for _, x := range ins {
		body := Body(x.data, x.attrs)
		var got pb.PubsubMessage
		if err := proto.Unmarshal(body, &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, &pb.PubsubMessage{Data: x.data, Attributes: x.attrs}) {
			t.Errorf("seq %d: body decodes as %v", x.seq, &got)
		}
		if n := DataSize(len(x.data)); n > len(body) {
			t.Errorf("seq %d: DataSize %d > body %d", x.seq, n, len(body))
		}
		var data []byte
		attrs := map[string]string{}
		Walk(body, func(p []byte) { data = p }, func(k, v []byte) { attrs[string(k)] = string(v) })
		if string(data) != string(x.data) || !maps.Equal(attrs, x.attrs) && len(x.attrs) > 0 {
			t.Errorf("seq %d: walked %q %v, want %q %v", x.seq, data, attrs, x.data, x.attrs)
		}
		for k, v := range x.attrs {
			if got, ok := Attr(body, k); !ok || string(got) != v {
				t.Errorf("seq %d: Attr(%q) = %q, %v; want %q", x.seq, k, got, ok, v)
			}
		}
		if _, ok := Attr(body, "absent"); ok {
			t.Errorf("seq %d: Attr finds an absent key", x.seq)
		}
	}
}

// TestStreamResponse checks the hand-written StreamingPullResponse encoding
// against what the protobuf runtime decodes from it.
func TestStreamResponse(t *testing.T) {
	var want []*pb.ReceivedMessage
	for _, x := range ins {
		want = append(want, &pb.ReceivedMessage{
			AckId: AckID(x.ackID),
			Message: &pb.PubsubMessage{Data: x.data, Attributes: x.attrs, MessageId: strconv.FormatUint(x.seq, 10),
				PublishTime: timestamppb.New(x.publish), OrderingKey: x.key},
			DeliveryAttempt: x.attempt,
		})
	}
	for _, tc := range []struct {
		ins          []in
		want         []*pb.ReceivedMessage
		eod, ordered bool
	}{
		{ins, want, false, false}, {ins[:1], want[:1], true, false}, {ins[2:], want[2:], false, true},
		{nil, nil, true, true}, {nil, nil, false, false},
	} {
		want := &pb.StreamingPullResponse{ReceivedMessages: tc.want,
			SubscriptionProperties: &pb.StreamingPullResponse_SubscriptionProperties{
				ExactlyOnceDeliveryEnabled: tc.eod, MessageOrderingEnabled: tc.ordered}}
		enc := []byte("junk")
		for _, x := range tc.ins {
			enc = AppendReceived(enc, x.ackID, x.seq, x.publish.UnixNano(), Body(x.data, x.attrs), x.key, x.attempt)
		}
		enc = AppendProps(enc, tc.eod, tc.ordered)
		got := &pb.StreamingPullResponse{}
		if err := proto.Unmarshal(enc[4:], got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(want, got) {
			t.Errorf("decoded response differs:\nwant %v\ngot  %v", prototext.Format(want), prototext.Format(got))
		}
		if len(got.ProtoReflect().GetUnknown()) != 0 {
			t.Errorf("unknown fields left after decoding: %x", got.ProtoReflect().GetUnknown())
		}
		// Sent as the unknown fields of an empty response, the bytes go out
		// exactly as they are.
		resp := &pb.StreamingPullResponse{}
		resp.ProtoReflect().SetUnknown(enc[4:])
		out, err := proto.Marshal(resp)
		if err != nil {
			t.Fatal(err)
		}
		if string(out) != string(enc[4:]) {
			t.Errorf("marshalled response is not the encoding")
		}
	}
}
