package schemacheck

import (
	"strings"
	"testing"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

const order = `{"type":"record","name":"Order","fields":[
	{"name":"id","type":"string"},
	{"name":"qty","type":"int"},
	{"name":"note","type":["null","string"]},
	{"name":"kind","type":{"type":"enum","name":"Kind","symbols":["RETAIL","BULK"]}}]}`

const product = `syntax = "proto3";
message Product {
  string product_name = 1;
  int32 SKU = 2;
}`

type check struct {
	name string
	enc  pb.Encoding
	data string
	ok   bool
}

func run(t *testing.T, v Validator, cases []check) {
	t.Helper()
	for _, c := range cases {
		if err := v([]byte(c.data), c.enc); (err == nil) != c.ok {
			t.Errorf("%s: %v, want ok=%v", c.name, err, c.ok)
		}
	}
}

func TestAvro(t *testing.T) {
	v, err := Parse(pb.Schema_AVRO, order)
	if err != nil {
		t.Fatal(err)
	}
	run(t, v, []check{
		{"json", pb.Encoding_JSON, `{"id":"o","qty":3,"note":null,"kind":"BULK"}`, true},
		{"json union wrapped", pb.Encoding_JSON, `{"id":"o","qty":3,"note":{"string":"x"},"kind":"BULK"}`, true},
		{"json union bare", pb.Encoding_JSON, `{"id":"o","qty":3,"note":"x","kind":"BULK"}`, false},
		{"json field missing", pb.Encoding_JSON, `{"id":"o","note":null,"kind":"BULK"}`, false},
		{"json unknown symbol", pb.Encoding_JSON, `{"id":"o","qty":3,"note":null,"kind":"GIFT"}`, false},
		{"json not JSON", pb.Encoding_JSON, `{"id":`, false},
		// id "o", qty 3, note null (branch 0), kind BULK (index 1)
		{"binary", pb.Encoding_BINARY, "\x02o\x06\x00\x02", true},
		{"binary truncated", pb.Encoding_BINARY, "\x02o\x06", false},
		{"binary enum index out of range", pb.Encoding_BINARY, "\x02o\x06\x00\x0a", false},
	})
}

func TestProtobuf(t *testing.T) {
	v, err := Parse(pb.Schema_PROTOCOL_BUFFER, product)
	if err != nil {
		t.Fatal(err)
	}
	md, err := ParseProto(product)
	if err != nil {
		t.Fatal(err)
	}
	m := dynamicpb.NewMessage(md)
	m.Set(md.Fields().ByName("product_name"), protoreflect.ValueOfString("GPU"))
	bin, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	run(t, v, []check{
		{"json", pb.Encoding_JSON, `{"product_name":"GPU","SKU":12}`, true},
		{"json camelCase", pb.Encoding_JSON, `{"productName":"GPU"}`, true},
		{"json unknown field", pb.Encoding_JSON, `{"product":"GPU"}`, false},
		{"json wrong type", pb.Encoding_JSON, `{"SKU":"many"}`, false},
		{"binary", pb.Encoding_BINARY, string(bin), true},
		{"binary garbage", pb.Encoding_BINARY, "\xff\xff\xff", false},
	})
}

func TestParseRefuses(t *testing.T) {
	for _, c := range []struct {
		typ       pb.Schema_Type
		def, want string
	}{
		{pb.Schema_AVRO, `{"type":"record"}`, "invalid Avro schema definition"},
		{pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A { string a = 1; } message B { int32 b = 1; }`, "exactly one top-level message"},
		{pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; import "other.proto"; message A { string a = 1; }`, "invalid protocol buffer schema definition"},
		{pb.Schema_PROTOCOL_BUFFER, `syntax = "proto3"; message A { strin a = 1; }`, "invalid protocol buffer schema definition"},
		{pb.Schema_TYPE_UNSPECIFIED, `{}`, "must be AVRO or PROTOCOL_BUFFER"},
	} {
		if _, err := Parse(c.typ, c.def); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%v, %.40q) = %v, want %q", c.typ, c.def, err, c.want)
		}
	}
}
