package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"sigs.k8s.io/yaml"
)

// Resources are topics and subscriptions a broker creates before it
// serves (Ensure).
type Resources struct {
	Topics        []*pb.Topic
	Subscriptions []*pb.Subscription
}

// ErrConflict marks a resource that exists with another configuration.
var ErrConflict = errors.New("exists with a different configuration")

// ParseResources reads YAML or JSON holding the Pub/Sub REST API's own
// Topic and Subscription resources, as `gcloud pubsub … --format=json`
// prints them: an object with "topics" and "subscriptions" lists, a list of
// resources (those with a "topic" field are subscriptions), or one
// resource. A short ID in a name, topic or dead-letter topic is taken to
// be in project (an error when project is empty).
func ParseResources(data []byte, project string) (*Resources, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("bootstrap: not YAML or JSON: %w", err)
	}
	var items []json.RawMessage
	var top map[string]json.RawMessage
	switch js = bytes.TrimSpace(js); {
	case len(js) == 0 || string(js) == "null":
	case js[0] == '[':
		if err := json.Unmarshal(js, &items); err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
	case js[0] == '{':
		if err := json.Unmarshal(js, &top); err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		_, hasTopics := top["topics"]
		_, hasSubs := top["subscriptions"]
		if !hasTopics && !hasSubs {
			items = []json.RawMessage{js}
			top = nil
		}
	default:
		return nil, errors.New("bootstrap: want an object with topics and subscriptions, a list of resources or one resource")
	}
	r := &Resources{}
	var lists struct{ Topics, Subscriptions []json.RawMessage }
	if top != nil {
		if err := json.Unmarshal(js, &lists); err != nil {
			return nil, fmt.Errorf("bootstrap: %w", err)
		}
		for k := range top {
			if k != "topics" && k != "subscriptions" {
				return nil, fmt.Errorf("bootstrap: unknown key %q (want topics and subscriptions)", k)
			}
		}
	}
	for _, it := range items {
		var probe map[string]json.RawMessage
		if err := json.Unmarshal(it, &probe); err != nil {
			return nil, fmt.Errorf("bootstrap: a resource is not an object: %w", err)
		}
		if _, ok := probe["topic"]; ok {
			lists.Subscriptions = append(lists.Subscriptions, it)
		} else {
			lists.Topics = append(lists.Topics, it)
		}
	}
	for i, raw := range lists.Topics {
		t := &pb.Topic{}
		if err := protojson.Unmarshal(raw, t); err != nil {
			return nil, fmt.Errorf("bootstrap: %stopic %d: %s", fileLine(data, err), i+1, fieldError(err))
		}
		r.Topics = append(r.Topics, t)
	}
	for i, raw := range lists.Subscriptions {
		s := &pb.Subscription{}
		if err := protojson.Unmarshal(raw, s); err != nil {
			return nil, fmt.Errorf("bootstrap: %ssubscription %d: %s", fileLine(data, err), i+1, fieldError(err))
		}
		r.Subscriptions = append(r.Subscriptions, s)
	}
	if err := r.Qualify(project); err != nil {
		return nil, fmt.Errorf("bootstrap: %w", err)
	}
	return r, nil
}

// jsonPos is the position protojson gives, in the JSON the file was
// turned into: one line, which is not the file's.
var jsonPos = regexp.MustCompile(`^proto:[\s\x{a0}]*(\(line \d+:\d+\):\s*)?`)

// errField is the field a protojson error names.
var errField = regexp.MustCompile(`unknown field "([^"]+)"|field ([A-Za-z_][A-Za-z0-9_]*)`)

// fieldError is a protojson error without its position in the JSON.
func fieldError(err error) string { return jsonPos.ReplaceAllString(err.Error(), "") }

// fileLine is "line N: " for the first line of the file (YAML or JSON)
// that sets the field err names, so a typo is found where it was made;
// empty when no line does.
func fileLine(data []byte, err error) string {
	m := errField.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	name := m[1] + m[2]
	key := regexp.MustCompile(`^[\s-]*["']?` + regexp.QuoteMeta(name) + `["']?\s*:`)
	for i, line := range strings.Split(string(data), "\n") {
		if key.MatchString(line) {
			return fmt.Sprintf("line %d: ", i+1)
		}
	}
	return ""
}

// Qualify turns the short IDs in names, topics and dead-letter topics into
// full names in project; a short ID without a project is an error.
func (r *Resources) Qualify(project string) error {
	var err error
	for i, t := range r.Topics {
		if t.Name, err = fullName(t.Name, project, "topics"); err != nil {
			return fmt.Errorf("topic %d: %w", i+1, err)
		}
	}
	for i, s := range r.Subscriptions {
		if s.Name, err = fullName(s.Name, project, "subscriptions"); err == nil {
			s.Topic, err = fullName(s.Topic, project, "topics")
		}
		if dl := s.DeadLetterPolicy; err == nil && dl != nil {
			dl.DeadLetterTopic, err = fullName(dl.DeadLetterTopic, project, "topics")
		}
		if err != nil {
			return fmt.Errorf("subscription %d: %w", i+1, err)
		}
	}
	return nil
}

// fullName makes projects/P/kind/ID of a short ID.
func fullName(name, project, kind string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("no %s name", strings.TrimSuffix(kind, "s"))
	}
	if strings.HasPrefix(name, "projects/") {
		return name, nil
	}
	if project == "" {
		return "", fmt.Errorf("%q is a short ID and no project is given", name)
	}
	return "projects/" + project + "/" + kind + "/" + name, nil
}

// Ensure creates r's topics, then its subscriptions. One that exists with
// the same configuration is left as it is; one that exists with another
// is an error (wrapping ErrConflict) that names the first field that
// differs, as the file spells it.
func (b *Broker) Ensure(ctx context.Context, r *Resources) error {
	for _, t := range r.Topics {
		_, err := b.pub.CreateTopic(ctx, t)
		if status.Code(err) == codes.AlreadyExists {
			var have *pb.Topic
			if have, err = b.pub.GetTopic(ctx, &pb.GetTopicRequest{Topic: t.Name}); err == nil {
				want := proto.Clone(t).(*pb.Topic)
				clearNotStored(have.ProtoReflect())
				clearNotStored(want.ProtoReflect())
				err = differ("topic "+t.Name, have, want)
			}
		}
		if err != nil {
			return fmt.Errorf("create topic %s: %w", t.Name, err)
		}
	}
	for _, s := range r.Subscriptions {
		_, err := b.sub.CreateSubscription(ctx, s)
		if status.Code(err) == codes.AlreadyExists {
			var have *pb.Subscription
			if have, err = b.sub.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: s.Name}); err == nil {
				want := proto.Clone(s).(*pb.Subscription)
				// The defaults a create fills in, on both sides: one made by
				// an older broker may lack those added since (push_config,
				// expiration_policy).
				if err = errors.Join(checkSubscriptionConfig(want), checkSubscriptionConfig(have)); err == nil {
					clearNotStored(have.ProtoReflect())
					clearNotStored(want.ProtoReflect())
					err = differ("subscription "+s.Name, have, want)
				}
			}
		}
		if err != nil {
			return fmt.Errorf("create subscription %s: %w", s.Name, err)
		}
	}
	return nil
}

// differ compares two resources field by field and names the first field
// that differs, with both values in the REST API's JSON.
func differ(what string, have, want proto.Message) error {
	path, hv, wv, ok := firstDiff(have.ProtoReflect(), want.ProtoReflect(), "")
	if ok {
		return nil
	}
	return fmt.Errorf("%s %w: %s is %s, the bootstrap asks for %s", what, ErrConflict, path, hv, wv)
}

func firstDiff(a, b protoreflect.Message, prefix string) (path, av, bv string, same bool) {
	fields := a.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if !a.Has(fd) && !b.Has(fd) {
			continue
		}
		name := prefix + fd.JSONName()
		// Into nested settings, not into durations and the like, which
		// read as one value.
		nested := fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap() &&
			fd.Message().ParentFile().Package() != "google.protobuf"
		if nested && a.Has(fd) && b.Has(fd) {
			if p, x, y, ok := firstDiff(a.Get(fd).Message(), b.Get(fd).Message(), name+"."); !ok {
				return p, x, y, false
			}
			continue
		}
		if !a.Has(fd) || !b.Has(fd) || !a.Get(fd).Equal(b.Get(fd)) {
			return name, jsonField(a, fd), jsonField(b, fd), false
		}
	}
	return "", "", "", true
}

// jsonField renders one field of m as the REST API's JSON shows it.
func jsonField(m protoreflect.Message, fd protoreflect.FieldDescriptor) string {
	if !m.Has(fd) {
		return "unset"
	}
	one := m.New()
	one.Set(fd, m.Get(fd))
	js, err := protojson.Marshal(one.Interface())
	if err != nil {
		return m.Get(fd).String()
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(js, &obj) != nil {
		return string(js)
	}
	return string(obj[fd.JSONName()])
}
