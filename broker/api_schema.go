package broker

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/logframe"
	"github.com/dedupflow/dedupflow/broker/internal/schemacheck"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/emptypb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Schemas: the SchemaService, and the checks of topics' schema_settings.
// A schema is a list of revisions, oldest first; each revision is parsed
// once, when it is committed, into a validator that publishes use outside
// the broker's lock. Schemas live under b.mu, like topics, and are logged
// as a whole on every change (they are small and change rarely).

const deletedSchema = "_deleted-schema_"

type schemaRev struct {
	proto *pb.Schema // name, type, definition, revision ID and time
	check schemacheck.Validator
}

type schema struct {
	name string
	revs []*schemaRev
}

func (s *schema) latest() *schemaRev { return s.revs[len(s.revs)-1] }

func (s *schema) rev(id string) *schemaRev {
	for _, r := range s.revs {
		if r.proto.RevisionId == id {
			return r
		}
	}
	return nil
}

// schemaServer implements google.pubsub.v1.SchemaService.
type schemaServer struct {
	pb.UnimplementedSchemaServiceServer
	b *Broker
}

// splitRevision splits "projects/P/schemas/S@REV".
func splitRevision(name string) (string, string, error) {
	base, rev, _ := strings.Cut(name, "@")
	if _, _, err := parseName(base, "schemas"); err != nil {
		return "", "", err
	}
	return base, rev, nil
}

// schemaLocked finds a schema and, for name@rev, the revision; b.mu held.
func (b *Broker) schemaLocked(name string) (*schema, *schemaRev, error) {
	base, rev, err := splitRevision(name)
	if err != nil {
		return nil, nil, err
	}
	s := b.schemas[base]
	if s == nil {
		return nil, nil, status.Errorf(codes.NotFound, "schema not found: %s", base)
	}
	if rev == "" {
		return s, s.latest(), nil
	}
	r := s.rev(rev)
	if r == nil {
		return nil, nil, status.Errorf(codes.NotFound, "schema %s has no revision %q", base, rev)
	}
	return s, r, nil
}

// newRevision parses def; the revision gets a fresh ID and the time now.
func (b *Broker) newRevision(s *schema, typ pb.Schema_Type, def string) (*schemaRev, error) {
	if len(def) > limits.SchemaDefinitionBytes {
		return nil, status.Errorf(codes.InvalidArgument, "the schema definition is %d bytes, the limit is %d", len(def), limits.SchemaDefinitionBytes)
	}
	check, err := schemacheck.Parse(typ, def)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	id := fmt.Sprintf("%08x", rand.Uint32())
	for s.rev(id) != nil {
		id = fmt.Sprintf("%08x", rand.Uint32())
	}
	return &schemaRev{check: check, proto: &pb.Schema{
		Name: s.name, Type: typ, Definition: def, RevisionId: id,
		RevisionCreateTime: timestamppb.New(b.now()),
	}}, nil
}

func view(r *schemaRev, v pb.SchemaView) *pb.Schema {
	out := proto.Clone(r.proto).(*pb.Schema)
	if v == pb.SchemaView_BASIC {
		out.Definition = ""
	}
	return out
}

func (srv *schemaServer) CreateSchema(ctx context.Context, req *pb.CreateSchemaRequest) (*pb.Schema, error) {
	if _, err := projectOf(req.Parent); err != nil {
		return nil, err
	}
	name := req.Parent + "/schemas/" + req.SchemaId
	if _, _, err := parseName(name, "schemas"); err != nil {
		return nil, err
	}
	if req.Schema == nil {
		return nil, status.Error(codes.InvalidArgument, "a schema is required")
	}
	s := &schema{name: name}
	r, err := srv.b.newRevision(s, req.Schema.Type, req.Schema.Definition)
	if err != nil {
		return nil, err
	}
	s.revs = []*schemaRev{r}
	b := srv.b
	err = b.change(ctx, func() error {
		if b.schemas[name] != nil {
			return status.Errorf(codes.AlreadyExists, "schema %s already exists", name)
		}
		b.putSchemaLocked(s)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return view(r, pb.SchemaView_FULL), nil
}

func (srv *schemaServer) GetSchema(_ context.Context, req *pb.GetSchemaRequest) (*pb.Schema, error) {
	b := srv.b
	b.mu.Lock()
	defer b.mu.Unlock()
	_, r, err := b.schemaLocked(req.Name)
	if err != nil {
		return nil, err
	}
	return view(r, req.View), nil
}

func (srv *schemaServer) ListSchemas(_ context.Context, req *pb.ListSchemasRequest) (*pb.ListSchemasResponse, error) {
	project, err := projectOf(req.Parent)
	if err != nil {
		return nil, err
	}
	b := srv.b
	b.mu.Lock()
	defer b.mu.Unlock()
	schemas, next, err := listPage(b.schemas, project, "schemas", req.PageSize, req.PageToken,
		func(s *schema) *pb.Schema { return view(s.latest(), listView(req.View)) })
	if err != nil {
		return nil, err
	}
	return &pb.ListSchemasResponse{Schemas: schemas, NextPageToken: next}, nil
}

// listView: lists leave the definition out unless asked for FULL.
func listView(v pb.SchemaView) pb.SchemaView {
	if v == pb.SchemaView_SCHEMA_VIEW_UNSPECIFIED {
		return pb.SchemaView_BASIC
	}
	return v
}

func (srv *schemaServer) ListSchemaRevisions(_ context.Context, req *pb.ListSchemaRevisionsRequest) (*pb.ListSchemaRevisionsResponse, error) {
	b := srv.b
	b.mu.Lock()
	defer b.mu.Unlock()
	s, _, err := b.schemaLocked(req.Name)
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(s.revs))
	for i, r := range s.revs {
		ids[i] = r.proto.RevisionId
	}
	ids, next, err := page(ids, req.PageSize, req.PageToken)
	if err != nil {
		return nil, err
	}
	resp := &pb.ListSchemaRevisionsResponse{NextPageToken: next}
	for _, id := range ids {
		resp.Schemas = append(resp.Schemas, view(s.rev(id), listView(req.View)))
	}
	return resp, nil
}

func (srv *schemaServer) CommitSchema(ctx context.Context, req *pb.CommitSchemaRequest) (*pb.Schema, error) {
	if req.Schema == nil {
		return nil, status.Error(codes.InvalidArgument, "a schema is required")
	}
	return srv.b.addRevision(ctx, req.Name, func(s *schema) (pb.Schema_Type, string, error) {
		if t := s.latest().proto.Type; req.Schema.Type != t {
			return 0, "", status.Errorf(codes.InvalidArgument, "schema %s is of type %v; a new revision cannot be %v", s.name, t, req.Schema.Type)
		}
		return req.Schema.Type, req.Schema.Definition, nil
	})
}

func (srv *schemaServer) RollbackSchema(ctx context.Context, req *pb.RollbackSchemaRequest) (*pb.Schema, error) {
	return srv.b.addRevision(ctx, req.Name, func(s *schema) (pb.Schema_Type, string, error) {
		r := s.rev(req.RevisionId)
		if r == nil {
			return 0, "", status.Errorf(codes.NotFound, "schema %s has no revision %q", s.name, req.RevisionId)
		}
		return r.proto.Type, r.proto.Definition, nil
	})
}

// addRevision appends the revision that pick describes to the named schema.
func (b *Broker) addRevision(ctx context.Context, name string, pick func(*schema) (pb.Schema_Type, string, error)) (*pb.Schema, error) {
	if _, _, err := parseName(name, "schemas"); err != nil {
		return nil, err
	}
	var r *schemaRev
	err := b.change(ctx, func() error {
		s := b.schemas[name]
		if s == nil {
			return status.Errorf(codes.NotFound, "schema not found: %s", name)
		}
		typ, def, err := pick(s)
		if err != nil {
			return err
		}
		// Parsed under the lock: commits are rare, and the revision list
		// must not change between the pick and the append.
		if r, err = b.newRevision(s, typ, def); err != nil {
			return err
		}
		b.putSchemaLocked(&schema{name: name, revs: append(slices.Clip(s.revs), r)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return view(r, pb.SchemaView_FULL), nil
}

func (srv *schemaServer) DeleteSchemaRevision(ctx context.Context, req *pb.DeleteSchemaRevisionRequest) (*pb.Schema, error) {
	name := req.Name
	//lint:ignore SA1019 deprecated in the API, yet older clients send the revision apart from the name
	if rev := req.RevisionId; rev != "" && !strings.Contains(name, "@") {
		name += "@" + rev
	}
	base, rev, err := splitRevision(name)
	if err != nil {
		return nil, err
	}
	if rev == "" {
		return nil, status.Errorf(codes.InvalidArgument, "name the revision to delete: %s@REVISION", base)
	}
	b := srv.b
	var r *schemaRev
	err = b.change(ctx, func() error {
		s, rv, err := b.schemaLocked(name)
		if err != nil {
			return err
		}
		if len(s.revs) == 1 {
			return status.Errorf(codes.FailedPrecondition, "revision %s is the only one of schema %s: delete the schema instead", rev, base)
		}
		r = rv
		b.putSchemaLocked(&schema{name: base, revs: slices.DeleteFunc(slices.Clone(s.revs), func(x *schemaRev) bool { return x == r })})
		return nil
	})
	if err != nil {
		return nil, err
	}
	return view(r, pb.SchemaView_FULL), nil
}

func (srv *schemaServer) DeleteSchema(ctx context.Context, req *pb.DeleteSchemaRequest) (*emptypb.Empty, error) {
	if _, _, err := parseName(req.Name, "schemas"); err != nil {
		return nil, err
	}
	b := srv.b
	return b.changeEmpty(ctx, func() error {
		s := b.schemas[req.Name]
		if s == nil {
			return status.Errorf(codes.NotFound, "schema not found: %s", req.Name)
		}
		b.deleteSchemaLocked(s)
		return nil
	})
}

func (srv *schemaServer) ValidateSchema(_ context.Context, req *pb.ValidateSchemaRequest) (*pb.ValidateSchemaResponse, error) {
	if _, err := projectOf(req.Parent); err != nil {
		return nil, err
	}
	if req.Schema == nil {
		return nil, status.Error(codes.InvalidArgument, "a schema is required")
	}
	if _, err := srv.b.newRevision(&schema{}, req.Schema.Type, req.Schema.Definition); err != nil {
		return nil, err
	}
	return &pb.ValidateSchemaResponse{}, nil
}

func (srv *schemaServer) ValidateMessage(_ context.Context, req *pb.ValidateMessageRequest) (*pb.ValidateMessageResponse, error) {
	if _, err := projectOf(req.Parent); err != nil {
		return nil, err
	}
	if err := checkEncoding(req.Encoding); err != nil {
		return nil, err
	}
	var check schemacheck.Validator
	switch sr := req.SchemaSpec.(type) {
	case *pb.ValidateMessageRequest_Name:
		b := srv.b
		b.mu.Lock()
		_, r, err := b.schemaLocked(sr.Name)
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
		check = r.check
	case *pb.ValidateMessageRequest_Schema:
		r, err := srv.b.newRevision(&schema{}, sr.Schema.GetType(), sr.Schema.GetDefinition())
		if err != nil {
			return nil, err
		}
		check = r.check
	default:
		return nil, status.Error(codes.InvalidArgument, "name a schema or give one")
	}
	if err := check(req.Message, req.Encoding); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "the message does not match the schema: %v", err)
	}
	return &pb.ValidateMessageResponse{}, nil
}

func checkEncoding(e pb.Encoding) error {
	if e != pb.Encoding_JSON && e != pb.Encoding_BINARY {
		return status.Errorf(codes.InvalidArgument, "encoding must be JSON or BINARY, not %v", e)
	}
	return nil
}

// checkSchemaSettingsLocked vets a topic's schema_settings: the schema and
// the revisions named exist, and the encoding is given. b.mu held.
func (b *Broker) checkSchemaSettingsLocked(ss *pb.SchemaSettings) error {
	if ss == nil {
		return nil
	}
	if ss.Schema == deletedSchema {
		return nil // kept by an update of a topic whose schema was deleted
	}
	s, _, err := b.schemaLocked(ss.Schema)
	if err != nil {
		return err
	}
	if err := checkEncoding(ss.Encoding); err != nil {
		return status.Errorf(codes.InvalidArgument, "schema_settings: %v", status.Convert(err).Message())
	}
	first, last := 0, len(s.revs)-1
	for _, e := range []struct {
		id  string
		at  *int
		end string
	}{{ss.FirstRevisionId, &first, "first"}, {ss.LastRevisionId, &last, "last"}} {
		if e.id == "" {
			continue
		}
		i := slices.IndexFunc(s.revs, func(r *schemaRev) bool { return r.proto.RevisionId == e.id })
		if i < 0 {
			return status.Errorf(codes.NotFound, "schema_settings: the %s revision %q is not a revision of %s", e.end, e.id, s.name)
		}
		*e.at = i
	}
	if first > last {
		return status.Errorf(codes.InvalidArgument, "schema_settings: the first revision %s comes after the last %s", ss.FirstRevisionId, ss.LastRevisionId)
	}
	return nil
}

// schemaPlan is what a publish checks its messages against: the revisions
// in the topic's range, newest first.
type schemaPlan struct {
	name string
	enc  pb.Encoding
	revs []*schemaRev
}

// schemaPlanLocked returns the topic's plan, nil without schema settings.
func (b *Broker) schemaPlanLocked(t *topic) (*schemaPlan, error) {
	ss := t.proto.SchemaSettings
	if ss == nil || ss.Schema == "" {
		return nil, nil
	}
	s := b.schemas[ss.Schema]
	if s == nil {
		return nil, status.Errorf(codes.NotFound, "the schema of topic %s was deleted", t.proto.Name)
	}
	p := &schemaPlan{name: s.name, enc: ss.Encoding}
	in := ss.FirstRevisionId == ""
	for _, r := range s.revs {
		in = in || r.proto.RevisionId == ss.FirstRevisionId
		if in {
			p.revs = append(p.revs, r)
		}
		if r.proto.RevisionId == ss.LastRevisionId {
			break
		}
	}
	slices.Reverse(p.revs)
	return p, nil
}

// validate checks each message against the plan's revisions and adds the
// attributes that tell subscribers which one it matched. Every failing
// message gets a line of the error.
func (p *schemaPlan) validate(msgs []*pb.PubsubMessage) error {
	var failed []string
	for i, m := range msgs {
		var first error
		var match *schemaRev
		for _, r := range p.revs {
			err := r.check(m.Data, p.enc)
			if err == nil {
				match = r
				break
			}
			if first == nil {
				first = err
			}
		}
		if match == nil {
			failed = append(failed, fmt.Sprintf("message %d does not match schema %s (%s encoding, %d revisions tried; newest says: %v)", i, p.name, p.enc, len(p.revs), first))
			continue
		}
		if m.Attributes == nil {
			m.Attributes = make(map[string]string, 3)
		}
		m.Attributes["googclient_schemaname"] = p.name
		m.Attributes["googclient_schemaencoding"] = p.enc.String()
		m.Attributes["googclient_schemarevisionid"] = match.proto.RevisionId
	}
	if len(failed) > 0 {
		return status.Error(codes.InvalidArgument, strings.Join(failed, "\n"))
	}
	return nil
}

func (b *Broker) putSchemaLocked(s *schema) {
	if b.schemas == nil {
		b.schemas = map[string]*schema{}
	}
	b.schemas[s.name] = s
	b.logSchema(s)
}

// deleteSchemaLocked removes s; topics that used it keep their encoding
// and show the schema as "_deleted-schema_", as the service does.
func (b *Broker) deleteSchemaLocked(s *schema) {
	delete(b.schemas, s.name)
	b.dropPolicyLocked(s.name)
	b.logRecord(recSchemaDel, func(d []byte) []byte { return logframe.AppendString(d, s.name) })
	for _, t := range b.topicByID {
		if ss := t.proto.SchemaSettings; ss != nil && ss.Schema == s.name {
			tp := proto.Clone(t.proto).(*pb.Topic)
			tp.SchemaSettings.Schema = deletedSchema
			b.putTopicLocked(t.id, tp)
		}
	}
}

func (b *Broker) logSchema(s *schema) {
	b.logRecord(recSchema, func(d []byte) []byte { return appendSchema(d, s) })
}

// checkSchema validates a publish against its topic's schema, if it has
// one. Only the plan is read under the lock; messages are checked outside.
func (b *Broker) checkSchema(req *pb.PublishRequest) error {
	b.mu.Lock()
	t := b.topics[req.Topic]
	var plan *schemaPlan
	var err error
	if t != nil {
		plan, err = b.schemaPlanLocked(t)
	}
	b.mu.Unlock()
	if err != nil || plan == nil {
		return err // a missing topic is reported by Publish
	}
	return plan.validate(req.Messages)
}
