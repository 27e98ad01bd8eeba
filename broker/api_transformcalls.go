package broker

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/transcode"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// The service's two calls for trying transforms without a resource,
// POST v1/projects/{project}:validateMessageTransform and
// :testMessageTransforms, are REST only here: the API version of the Go
// client library the broker is built on has no messages for them, so their
// JSON is read and written by hand around the protobuf types it does have.
//
// As the REST reference describes them: validate takes one
// MessageTransform and answers an empty object, or INVALID_ARGUMENT naming
// what is wrong, exactly as creating a topic with it would. Test takes a
// message and one source of transforms: a list given inline, or a topic's or
// a subscription's. It answers the message as each enabled transform left
// it, in order (transformedMessage), and stops at the first that filters it
// out (filteredMessage) or fails (failedMessage, with the error).

// transformCall is the verb of each call, after "projects/{project}:".
var transformCall = map[string]func(*Broker, []byte) (any, error){
	"validateMessageTransform": (*Broker).validateMessageTransform,
	"testMessageTransforms":    (*Broker).testMessageTransforms,
}

// serveTransformCall serves a request for one of the transform calls, and
// reports whether it was one.
func (b *Broker) serveTransformCall(w http.ResponseWriter, r *http.Request, segs []string) bool {
	if len(segs) != 3 || segs[0] != "v1" || segs[1] != "projects" {
		return false
	}
	project, verb, ok := strings.Cut(segs[2], ":")
	call := transformCall[verb]
	if !ok || call == nil {
		return false
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		transcode.WriteStatus(w, grpcstatus.New(codes.NotFound, fmt.Sprintf("%s %s is not a method of the Pub/Sub v1 REST API (this path takes POST)", r.Method, r.URL.Path)))
		return true
	}
	if err := limits.Project(project); err != nil {
		transcode.WriteStatus(w, grpcstatus.New(codes.InvalidArgument, fmt.Sprintf("invalid project %q in the path: %v", project, err)))
		return true
	}
	body, err := transcode.ReadBody(w, r)
	if err == nil {
		var resp any
		if resp, err = call(b, body); err == nil {
			out, merr := json.Marshal(resp)
			if merr != nil {
				err = grpcstatus.Errorf(codes.Internal, "encode response: %v", merr)
			} else {
				w.Header().Set("Content-Type", "application/json; charset=UTF-8")
				_, _ = w.Write(out)
				return true
			}
		}
	}
	transcode.WriteStatus(w, grpcstatus.Convert(err))
	return true
}

// readJSON decodes the named fields of a request body, each kept as JSON
// for the protobuf decoder; a field the call does not know is refused, as
// the service refuses it.
func readJSON(body []byte, fields ...string) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if len(body) > 0 {
		if err := json.Unmarshal(body, &m); err != nil {
			return nil, grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload: %v", err)
		}
	}
	for k := range m {
		known := false
		for _, f := range fields {
			known = known || k == f
		}
		if !known {
			return nil, grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload: unknown name %q", k)
		}
	}
	return m, nil
}

func protoField(m map[string]json.RawMessage, name string, into proto.Message) error {
	if err := protojson.Unmarshal(m[name], into); err != nil {
		return grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload in %s: %v", name, err)
	}
	return nil
}

func (b *Broker) validateMessageTransform(body []byte) (any, error) {
	m, err := readJSON(body, "messageTransform")
	if err != nil {
		return nil, err
	}
	if m["messageTransform"] == nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, "message_transform is required")
	}
	var t pb.MessageTransform
	if err := protoField(m, "messageTransform", &t); err != nil {
		return nil, err
	}
	if err := checkTransforms([]*pb.MessageTransform{&t}); err != nil {
		return nil, err
	}
	return struct{}{}, nil
}

// testedMessage is one step of a test's answer; exactly one field is set.
type testedMessage struct {
	Transformed json.RawMessage `json:"transformedMessage,omitempty"`
	Filtered    *struct{}       `json:"filteredMessage,omitempty"`
	Failed      *failedMessage  `json:"failedMessage,omitempty"`
}

type failedMessage struct {
	Error json.RawMessage `json:"error"`
}

func (b *Broker) testMessageTransforms(body []byte) (any, error) {
	m, err := readJSON(body, "message", "messageTransforms", "topic", "subscription")
	if err != nil {
		return nil, err
	}
	if m["message"] == nil {
		return nil, grpcstatus.Error(codes.InvalidArgument, "message is required")
	}
	var msg pb.PubsubMessage
	if err := protoField(m, "message", &msg); err != nil {
		return nil, err
	}
	if _, err := checkMessage(0, &msg); err != nil {
		return nil, err
	}
	src, err := b.transformsToTest(m)
	if err != nil {
		return nil, err
	}
	// Compiled afresh, so that a test counts nothing on the /broker page.
	ts, err := compileTransforms(src)
	if err != nil {
		return nil, err
	}
	steps := []testedMessage{}
	if ts == nil {
		return map[string]any{"transformedMessages": steps}, nil
	}
	cur := &msg
	for _, t := range ts.list {
		if t.disabled {
			continue
		}
		out, err := (&transforms{list: []*transform{t}}).apply(cur)
		switch {
		case err != nil:
			e, _ := protojson.Marshal(&status.Status{Code: int32(transformCode(err)), Message: err.Error()})
			steps = append(steps, testedMessage{Failed: &failedMessage{Error: e}})
		case out == nil:
			steps = append(steps, testedMessage{Filtered: &struct{}{}})
		default:
			j, err := protojson.Marshal(out)
			if err != nil {
				return nil, grpcstatus.Errorf(codes.Internal, "encode message: %v", err)
			}
			steps = append(steps, testedMessage{Transformed: j})
			cur = out
			continue
		}
		break
	}
	return map[string]any{"transformedMessages": steps}, nil
}

// transformsToTest returns the transforms a test names: inline, or those of
// a topic or a subscription; exactly one of the three.
func (b *Broker) transformsToTest(m map[string]json.RawMessage) ([]*pb.MessageTransform, error) {
	var topic, sub string
	for name, into := range map[string]*string{"topic": &topic, "subscription": &sub} {
		if raw := m[name]; raw != nil {
			if err := json.Unmarshal(raw, into); err != nil {
				return nil, grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload in %s: %v", name, err)
			}
		}
	}
	given := 0
	for _, set := range []bool{m["messageTransforms"] != nil, topic != "", sub != ""} {
		if set {
			given++
		}
	}
	if given != 1 {
		return nil, grpcstatus.Error(codes.InvalidArgument, "exactly one of message_transforms, topic and subscription must be set")
	}
	switch {
	case topic != "":
		b.mu.Lock()
		defer b.mu.Unlock()
		t, err := (&publisherServer{b: b}).topic(topic)
		if err != nil {
			return nil, err
		}
		return t.proto.MessageTransforms, nil
	case sub != "":
		b.mu.Lock()
		defer b.mu.Unlock()
		s, err := (&subscriberServer{b: b}).subscription(sub)
		if err != nil {
			return nil, err
		}
		return s.proto.MessageTransforms, nil
	}
	var list struct {
		MessageTransforms []json.RawMessage `json:"messageTransforms"`
	}
	if err := json.Unmarshal(m["messageTransforms"], &list); err != nil {
		return nil, grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload in messageTransforms: %v", err)
	}
	if len(list.MessageTransforms) == 0 {
		return nil, grpcstatus.Error(codes.InvalidArgument, "message_transforms.message_transforms is empty")
	}
	out := make([]*pb.MessageTransform, len(list.MessageTransforms))
	for i, raw := range list.MessageTransforms {
		out[i] = &pb.MessageTransform{}
		if err := protojson.Unmarshal(raw, out[i]); err != nil {
			return nil, grpcstatus.Errorf(codes.InvalidArgument, "invalid JSON payload in messageTransforms[%d]: %v", i, err)
		}
	}
	return out, nil
}
