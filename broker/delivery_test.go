package broker

import (
	"maps"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/broker/internal/wire"
)

// TestDeliveryEncoding: a message gives back its data and attributes, as
// the protobuf message they stand for (package wire checks the encoding,
// and the StreamingPull response, on its own).
func TestDeliveryEncoding(t *testing.T) {
	ins := []struct {
		seq, ackID uint64
		publish    time.Time
		data       []byte
		attrs      map[string]string
		key        string
		attempt    int32
	}{
		{seq: 1, ackID: 1, publish: time.Date(2024, 5, 6, 7, 8, 9, 123456789, time.UTC), data: []byte("hello"),
			attrs: map[string]string{"a": "1", "": "no key"}, key: "k", attempt: 2},
		{seq: 2, ackID: 40, publish: time.Unix(0, 0)},
	}
	for _, x := range ins {
		m := &message{seq: x.seq, publish: x.publish.UnixNano(), body: wire.Body(x.data, x.attrs), key: x.key}
		if string(m.data()) != string(x.data) || (len(x.data) == 0) != (m.data() == nil) {
			t.Errorf("seq %d: data %q, want %q", x.seq, m.data(), x.data)
		}
		if !maps.Equal(m.attrs(), x.attrs) || m.numAttrs() != len(x.attrs) {
			t.Errorf("seq %d: attributes %v (%d), want %v", x.seq, m.attrs(), m.numAttrs(), x.attrs)
		}
		d := delivery{m: m, ackID: x.ackID, attempt: x.attempt}
		want := &pb.ReceivedMessage{AckId: wire.AckID(x.ackID), DeliveryAttempt: x.attempt,
			Message: &pb.PubsubMessage{Data: x.data, Attributes: x.attrs, MessageId: m.id(),
				PublishTime: timestamppb.New(x.publish), OrderingKey: x.key}}
		if !proto.Equal(d.proto(), want) {
			t.Errorf("seq %d: proto %v, want %v", x.seq, d.proto(), want)
		}
	}
}
