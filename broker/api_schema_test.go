package broker

import (
	"context"
	"strings"
	"testing"
	"time"

	pubsubapi "cloud.google.com/go/pubsub/v2/apiv1"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/hamba/avro/v2"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/dedupflow/dedupflow/broker/internal/schemacheck"
)

const orderAvro = `{"type":"record","name":"Order","namespace":"shop","fields":[
	{"name":"id","type":"string"},
	{"name":"qty","type":"int"},
	{"name":"note","type":["null","string"]},
	{"name":"kind","type":{"type":"enum","name":"Kind","symbols":["RETAIL","BULK"]}},
	{"name":"tags","type":{"type":"array","items":"string"}}]}`

// orderAvro2 adds a field: a message with it matches only this revision.
const orderAvro2 = `{"type":"record","name":"Order","namespace":"shop","fields":[
	{"name":"id","type":"string"},
	{"name":"qty","type":"int"},
	{"name":"note","type":["null","string"]},
	{"name":"kind","type":{"type":"enum","name":"Kind","symbols":["RETAIL","BULK"]}},
	{"name":"tags","type":{"type":"array","items":"string"}},
	{"name":"priority","type":"long"}]}`

func schemaClient(t testing.TB, addr string) *pubsubapi.SchemaClient {
	t.Helper()
	c, err := pubsubapi.NewSchemaClient(context.Background(), option.WithEndpoint(addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func avroBinary(t testing.TB, def string, v any) []byte {
	t.Helper()
	b, err := avro.Marshal(avro.MustParse(def), v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestAvroSchema runs the same Avro scenario against Google's emulator and
// ours: which messages each encoding accepts, the attributes delivered
// messages carry, and revisions.
func TestAvroSchema(t *testing.T) {
	valid := map[string]any{"id": "o-1", "qty": 3, "note": nil, "kind": "BULK", "tags": []any{"a"}}
	bin := avroBinary(t, orderAvro, valid)
	cases := []struct {
		name string
		enc  pb.Encoding
		data string
		ok   bool
	}{
		{"json valid", pb.Encoding_JSON, `{"id":"o-1","qty":3,"note":null,"kind":"BULK","tags":["a"]}`, true},
		{"json union wrapped", pb.Encoding_JSON, `{"id":"o-1","qty":3,"note":{"string":"fragile"},"kind":"RETAIL","tags":[]}`, true},
		{"json union bare", pb.Encoding_JSON, `{"id":"o-1","qty":3,"note":"fragile","kind":"RETAIL","tags":[]}`, false},
		{"json field missing", pb.Encoding_JSON, `{"id":"o-1","qty":3,"kind":"RETAIL","tags":[]}`, false},
		{"json extra field", pb.Encoding_JSON, `{"id":"o-1","qty":3,"note":null,"kind":"RETAIL","tags":[],"x":1}`, true}, // ignored, as Avro's Java decoder does
		{"json wrong type", pb.Encoding_JSON, `{"id":"o-1","qty":"3","note":null,"kind":"RETAIL","tags":[]}`, false},
		{"json fraction for an int", pb.Encoding_JSON, `{"id":"o-1","qty":1.5,"note":null,"kind":"RETAIL","tags":[]}`, true}, // cut off, likewise
		{"json int out of range", pb.Encoding_JSON, `{"id":"o-1","qty":3000000000,"note":null,"kind":"RETAIL","tags":[]}`, false},
		{"json number for a string", pb.Encoding_JSON, `{"id":7,"qty":1,"note":null,"kind":"RETAIL","tags":[]}`, false},
		{"json union branch unknown", pb.Encoding_JSON, `{"id":"o-1","qty":1,"note":{"int":1},"kind":"RETAIL","tags":[]}`, false},
		{"json unknown symbol", pb.Encoding_JSON, `{"id":"o-1","qty":3,"note":null,"kind":"GIFT","tags":[]}`, false},
		{"json not JSON", pb.Encoding_JSON, `{"id":`, false},
		{"binary valid", pb.Encoding_BINARY, string(bin), true},
		{"binary truncated", pb.Encoding_BINARY, string(bin[:len(bin)-2]), false},
		{"binary is JSON", pb.Encoding_BINARY, `{"id":"o-1"}`, false},
		{"binary by hand", pb.Encoding_BINARY, "\x02o\x06\x00\x02\x00", true},
		{"binary enum index out of range", pb.Encoding_BINARY, "\x02o\x06\x00\x0a\x00", false},
		{"binary union index out of range", pb.Encoding_BINARY, "\x02o\x06\x06\x02\x00", false},
		{"binary negative string length", pb.Encoding_BINARY, "\x01o\x06\x00\x02\x00", false},
		{"binary array of two", pb.Encoding_BINARY, "\x02o\x06\x02\x02x\x02\x04\x02a\x02b\x00", true},
	}
	forEachTarget(t, []string{"emulator"}, func(t *testing.T, tg target) {
		ctx := context.Background()
		c, sc := newClient(t, tg.addr), schemaClient(t, tg.addr)
		sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: unique("order"),
			Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
		if err != nil {
			t.Fatal(err)
		}
		if len(sch.RevisionId) != 8 || sch.RevisionCreateTime == nil {
			t.Errorf("created schema %v: want an 8-character revision ID and a time", sch)
		}
		topics := map[pb.Encoding]string{}
		for _, enc := range []pb.Encoding{pb.Encoding_JSON, pb.Encoding_BINARY} {
			tp, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("avro")),
				SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: enc}})
			if err != nil {
				t.Fatal(err)
			}
			topics[enc] = tp.Name
		}
		for _, tc := range cases {
			_, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topics[tc.enc], Messages: []*pb.PubsubMessage{{Data: []byte(tc.data)}}})
			if (err == nil) != tc.ok || (err != nil && status.Code(err) != codes.InvalidArgument) {
				t.Errorf("%s: publish answered %v, want ok=%v (InvalidArgument when refused)", tc.name, err, tc.ok)
			}
			_, err = sc.ValidateMessage(ctx, &pb.ValidateMessageRequest{Parent: "projects/" + project,
				SchemaSpec: &pb.ValidateMessageRequest_Name{Name: sch.Name}, Message: []byte(tc.data), Encoding: tc.enc})
			if (err == nil) != tc.ok {
				t.Errorf("%s: ValidateMessage answered %v, want ok=%v", tc.name, err, tc.ok)
			}
		}
		// A delivered message says which schema, encoding and revision it
		// matched; with two revisions, the one that fits.
		rev2, err := sc.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: sch.Name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro2}})
		if err != nil {
			t.Fatal(err)
		}
		sub := createSub(t, c, &pb.Subscription{Topic: topics[pb.Encoding_BINARY]}).Name
		v2 := map[string]any{"id": "o-2", "qty": 1, "note": nil, "kind": "RETAIL", "tags": []any{}, "priority": int64(9)}
		for _, data := range [][]byte{bin, avroBinary(t, orderAvro2, v2)} {
			if _, err := c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: topics[pb.Encoding_BINARY], Messages: []*pb.PubsubMessage{{Data: data}}}); err != nil {
				t.Fatalf("publish to a topic with two revisions: %v", err)
			}
		}
		got := map[string]string{}
		for range 2 {
			m := pullOne(t, c, sub, 10*time.Second)
			a := m.Message.Attributes
			if a["googclient_schemaname"] != sch.Name || a["googclient_schemaencoding"] != "BINARY" {
				t.Errorf("delivered attributes %v: want the schema name and BINARY", a)
			}
			got[a["googclient_schemarevisionid"]] = string(m.Message.Data[:4])
			if err := c.SubscriptionAdminClient.Acknowledge(ctx, &pb.AcknowledgeRequest{Subscription: sub, AckIds: []string{m.AckId}}); err != nil {
				t.Fatal(err)
			}
		}
		if got[sch.RevisionId] != string(bin[:4]) || len(got) != 2 || got[rev2.RevisionId] == "" {
			t.Errorf("revisions matched %v: want the first message on %s, the second on %s", got, sch.RevisionId, rev2.RevisionId)
		}
		if _, err := sc.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: "projects/" + project,
			Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: `{"type":"record"}`}}); status.Code(err) != codes.InvalidArgument {
			t.Errorf("ValidateSchema of a record without a name: %v, want InvalidArgument", err)
		}
		_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("avro")),
			SchemaSettings: &pb.SchemaSettings{Schema: sch.Name + "-none", Encoding: pb.Encoding_JSON}})
		if status.Code(err) != codes.NotFound {
			t.Errorf("topic with a missing schema: %v, want NotFound", err)
		}
		_, err = c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("avro")), SchemaSettings: &pb.SchemaSettings{Schema: sch.Name}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("topic without an encoding: %v, want InvalidArgument", err)
		}
	})
}

// TestPublishNamesFailingMessages: one line per message that matches no
// revision, naming it and why.
func TestPublishNamesFailingMessages(t *testing.T) {
	tg := startOurs(t, Options{})
	ctx := context.Background()
	c, sc := newClient(t, tg.addr), schemaClient(t, tg.addr)
	sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: "projects/" + project, SchemaId: "order",
		Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
	if err != nil {
		t.Fatal(err)
	}
	tp, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName("orders"), SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: pb.Encoding_JSON}})
	if err != nil {
		t.Fatal(err)
	}
	good := `{"id":"o-1","qty":3,"note":null,"kind":"BULK","tags":[]}`
	_, err = c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: tp.Name, Messages: []*pb.PubsubMessage{
		{Data: []byte(good)}, {Data: []byte(`{"id":"o-2"}`)}, {Data: []byte(good)}, {Data: []byte(`[1]`)},
	}})
	lines := strings.Split(status.Convert(err).Message(), "\n")
	if status.Code(err) != codes.InvalidArgument || len(lines) != 2 ||
		!strings.HasPrefix(lines[0], "message 1 ") || !strings.Contains(lines[0], `field "qty" of shop.Order is missing`) ||
		!strings.HasPrefix(lines[1], "message 3 ") || !strings.Contains(lines[1], "want an object, got an array") {
		t.Fatalf("publish of two bad messages among good ones: %v", err)
	}
}

// The example of the service's documentation ("Create a schema",
// protocol buffer), checked as the documentation says: JSON in protobuf's
// JSON mapping, BINARY in its wire format, exactly one top-level message.
const productProto = `syntax = "proto3";
message ProtocolBuffer {
  string product_name = 1;
  int32 SKU = 2;
  bool in_stock = 3;
}`

func TestProtobufSchema(t *testing.T) {
	tg := startOurs(t, Options{})
	ctx := context.Background()
	c, sc := newClient(t, tg.addr), schemaClient(t, tg.addr)
	parent := "projects/" + project
	for _, bad := range []string{
		`syntax = "proto3"; message A { string a = 1; } message B { int32 b = 1; }`,
		`syntax = "proto3"; import "other.proto"; message A { string a = 1; }`,
		`syntax = "proto3"; message A { strin a = 1; }`,
	} {
		_, err := sc.ValidateSchema(ctx, &pb.ValidateSchemaRequest{Parent: parent, Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: bad}})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("ValidateSchema(%q): %v, want InvalidArgument", bad, err)
		}
	}
	sch, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "product",
		Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: productProto}})
	if err != nil {
		t.Fatal(err)
	}
	md, err := schemacheck.ParseProto(productProto)
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("product_name"), protoreflect.ValueOfString("GPU"))
	wire, _ := proto.Marshal(m)
	for _, tc := range []struct {
		name string
		enc  pb.Encoding
		data string
		ok   bool
	}{
		{"json", pb.Encoding_JSON, `{"product_name":"GPU","SKU":12,"in_stock":true}`, true},
		{"json camelCase", pb.Encoding_JSON, `{"productName":"GPU"}`, true},
		{"json unknown field", pb.Encoding_JSON, `{"product":"GPU"}`, false},
		{"json wrong type", pb.Encoding_JSON, `{"SKU":"many"}`, false},
		{"binary", pb.Encoding_BINARY, string(wire), true},
		{"binary garbage", pb.Encoding_BINARY, "\xff\xff\xff", false},
	} {
		tp, err := c.TopicAdminClient.CreateTopic(ctx, &pb.Topic{Name: topicName(unique("proto")), SchemaSettings: &pb.SchemaSettings{Schema: sch.Name, Encoding: tc.enc}})
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.TopicAdminClient.Publish(ctx, &pb.PublishRequest{Topic: tp.Name, Messages: []*pb.PubsubMessage{{Data: []byte(tc.data)}}})
		if (err == nil) != tc.ok {
			t.Errorf("%s: publish answered %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}

// TestSchemaRevisions covers the revision calls and what deleting does,
// and that all of it survives a restart.
func TestSchemaRevisions(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	b, err := New(Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	sc := &schemaServer{b: b}
	parent := "projects/" + project
	r1, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "order", Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro}})
	if err != nil {
		t.Fatal(err)
	}
	name := r1.Name
	if _, err := sc.CreateSchema(ctx, &pb.CreateSchemaRequest{Parent: parent, SchemaId: "order", Schema: r1}); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}
	r2, err := sc.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_AVRO, Definition: orderAvro2}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc.CommitSchema(ctx, &pb.CommitSchemaRequest{Name: name, Schema: &pb.Schema{Type: pb.Schema_PROTOCOL_BUFFER, Definition: productProto}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("commit of another type: %v, want InvalidArgument", err)
	}
	r3, err := sc.RollbackSchema(ctx, &pb.RollbackSchemaRequest{Name: name, RevisionId: r1.RevisionId})
	if err != nil || r3.Definition != orderAvro || r3.RevisionId == r1.RevisionId {
		t.Fatalf("rollback: %v %v, want a new revision with the first definition", r3, err)
	}
	// A topic that takes only the second revision.
	tp, err := b.pub.CreateTopic(ctx, &pb.Topic{Name: topicName("orders"), SchemaSettings: &pb.SchemaSettings{
		Schema: name, Encoding: pb.Encoding_JSON, FirstRevisionId: r2.RevisionId, LastRevisionId: r2.RevisionId}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pub.CreateTopic(ctx, &pb.Topic{Name: topicName("orders-x"), SchemaSettings: &pb.SchemaSettings{
		Schema: name, Encoding: pb.Encoding_JSON, FirstRevisionId: r3.RevisionId, LastRevisionId: r1.RevisionId}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("first revision after the last: %v, want InvalidArgument", err)
	}
	b.Close()

	b, err = New(Options{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	sc = &schemaServer{b: b}
	v1 := `{"id":"o-1","qty":3,"note":null,"kind":"BULK","tags":[]}`
	v2 := `{"id":"o-1","qty":3,"note":null,"kind":"BULK","tags":[],"priority":1}`
	if _, err := b.pub.Publish(ctx, &pb.PublishRequest{Topic: tp.Name, Messages: []*pb.PubsubMessage{{Data: []byte(v1)}}}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("after a restart, a message of revision 1 on a topic of revision 2: %v, want InvalidArgument", err)
	}
	if _, err := b.pub.Publish(ctx, &pb.PublishRequest{Topic: tp.Name, Messages: []*pb.PubsubMessage{{Data: []byte(v2)}}}); err != nil {
		t.Fatalf("after a restart, a message of revision 2: %v", err)
	}
	got, err := sc.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@" + r2.RevisionId})
	if err != nil || got.Definition != orderAvro2 {
		t.Fatalf("get %s@%s: %v %v", name, r2.RevisionId, got, err)
	}
	if got, err := sc.GetSchema(ctx, &pb.GetSchemaRequest{Name: name, View: pb.SchemaView_BASIC}); err != nil || got.RevisionId != r3.RevisionId || got.Definition != "" {
		t.Fatalf("get latest, BASIC: %v %v; want revision %s without its definition", got, err, r3.RevisionId)
	}
	revs, err := sc.ListSchemaRevisions(ctx, &pb.ListSchemaRevisionsRequest{Name: name, View: pb.SchemaView_FULL})
	if err != nil || len(revs.Schemas) != 3 || revs.Schemas[1].RevisionId != r2.RevisionId {
		t.Fatalf("revisions: %v %v", revs, err)
	}
	if _, err := sc.DeleteSchemaRevision(ctx, &pb.DeleteSchemaRevisionRequest{Name: name + "@" + r1.RevisionId}); err != nil {
		t.Fatal(err)
	}
	if _, err := sc.GetSchema(ctx, &pb.GetSchemaRequest{Name: name + "@" + r1.RevisionId}); status.Code(err) != codes.NotFound {
		t.Fatalf("deleted revision: %v, want NotFound", err)
	}
	list, err := sc.ListSchemas(ctx, &pb.ListSchemasRequest{Parent: parent})
	if err != nil || len(list.Schemas) != 1 || list.Schemas[0].Name != name {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := sc.DeleteSchema(ctx, &pb.DeleteSchemaRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.pub.GetTopic(ctx, &pb.GetTopicRequest{Topic: tp.Name}); got.GetSchemaSettings().GetSchema() != deletedSchema {
		t.Fatalf("topic after its schema was deleted: %v, want schema %q", got, deletedSchema)
	}
	if _, err := b.pub.Publish(ctx, &pb.PublishRequest{Topic: tp.Name, Messages: []*pb.PubsubMessage{{Data: []byte(v2)}}}); status.Code(err) != codes.NotFound {
		t.Fatalf("publish after the schema was deleted: %v, want NotFound", err)
	}
}
