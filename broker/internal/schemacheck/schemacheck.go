// Package schemacheck parses Pub/Sub schema revisions, Avro and protocol
// buffers, as the service accepts them, and checks a message's data in
// either encoding, binary or JSON, against a parsed revision.
package schemacheck

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/bufbuild/protocompile"
	"github.com/hamba/avro/v2"
	"github.com/tidwall/gjson"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"
)

// Validator checks one message's data in the given encoding against a
// parsed schema revision. Revisions are parsed once, when committed, and
// validators are safe for concurrent use.
type Validator func(data []byte, enc pb.Encoding) error

// Parse parses a schema definition of type typ.
func Parse(typ pb.Schema_Type, def string) (Validator, error) {
	switch typ {
	case pb.Schema_AVRO:
		// A cache of its own: hamba's default cache is global, and would let
		// one schema refer to types that another one defined.
		s, err := avro.ParseWithCache(def, "", &avro.SchemaCache{})
		if err != nil {
			return nil, fmt.Errorf("invalid Avro schema definition: %w", err)
		}
		return avroValidator(s), nil
	case pb.Schema_PROTOCOL_BUFFER:
		md, err := ParseProto(def)
		if err != nil {
			return nil, fmt.Errorf("invalid protocol buffer schema definition: %w", err)
		}
		return protoValidator(md), nil
	}
	return nil, fmt.Errorf("schema type must be AVRO or PROTOCOL_BUFFER, not %v", typ)
}

// ParseProto compiles a .proto definition that, as the service requires,
// defines exactly one top-level message and imports nothing.
func ParseProto(def string) (protoreflect.MessageDescriptor, error) {
	const file = "schema.proto"
	c := protocompile.Compiler{
		Resolver: &protocompile.SourceResolver{Accessor: protocompile.SourceAccessorFromMap(map[string]string{file: def})},
	}
	files, err := c.Compile(context.Background(), file)
	if err != nil {
		return nil, err
	}
	fd := files[0]
	if fd.Imports().Len() > 0 {
		return nil, fmt.Errorf("imports are not supported (%s)", fd.Imports().Get(0).Path())
	}
	if n := fd.Messages().Len(); n != 1 {
		return nil, fmt.Errorf("the definition must have exactly one top-level message, it has %d", n)
	}
	return fd.Messages().Get(0), nil
}

func protoValidator(md protoreflect.MessageDescriptor) Validator {
	return func(data []byte, enc pb.Encoding) error {
		m := dynamicpb.NewMessage(md)
		var err error
		if enc == pb.Encoding_JSON {
			err = protojson.Unmarshal(data, m)
		} else {
			err = proto.Unmarshal(data, m)
		}
		if err != nil {
			return fmt.Errorf("not a valid %s %s message: %s", md.FullName(), enc, strings.TrimSpace(strings.TrimPrefix(err.Error(), "proto:")))
		}
		return nil
	}
}

func avroValidator(s avro.Schema) Validator {
	return func(data []byte, enc pb.Encoding) error {
		if enc == pb.Encoding_BINARY {
			r := avro.NewReader(nil, 0).Reset(data)
			skipAvro(r, s)
			if errors.Is(r.Error, io.EOF) {
				return errors.New("not valid Avro binary: the data ends inside the value")
			}
			if r.Error != nil {
				return fmt.Errorf("not valid Avro binary: %w", r.Error)
			}
			return nil
		}
		// gjson walks the text in place: decoding into maps and slices
		// first cost more than the rest of a publish.
		if !gjson.ValidBytes(data) {
			return errors.New("not valid JSON")
		}
		v := gjson.ParseBytes(data)
		if err := checkAvroJSON(s, v, "$"); err != nil {
			return fmt.Errorf("not valid Avro JSON: %w", err)
		}
		return nil
	}
}

// skipAvro reads one value of schema s and keeps nothing: decoding into
// Go values (avro.Unmarshal into an any) allocated a map per record, which
// cost more than the rest of a publish. Errors land in r.Error, io.EOF when
// the data is too short (which avro.Unmarshal would take for success).
func skipAvro(r *avro.Reader, s avro.Schema) {
	if rs, ok := s.(*avro.RefSchema); ok {
		s = rs.Schema()
	}
	if r.Error != nil {
		return
	}
	length := func(what string) int64 {
		n := r.ReadLong()
		if n < 0 && r.Error == nil {
			r.ReportError("skip "+what, "negative length")
		}
		return n
	}
	switch s.Type() {
	case avro.Null:
	case avro.Boolean:
		r.ReadBool()
	case avro.Int:
		r.ReadInt()
	case avro.Long:
		r.ReadLong()
	case avro.Float:
		r.SkipFloat()
	case avro.Double:
		r.SkipDouble()
	case avro.String, avro.Bytes:
		if n := length(string(s.Type())); n > 0 {
			r.SkipNBytes(int(n))
		}
	case avro.Fixed:
		r.SkipNBytes(s.(*avro.FixedSchema).Size())
	case avro.Enum:
		if i := r.ReadInt(); r.Error == nil && (i < 0 || int(i) >= len(s.(*avro.EnumSchema).Symbols())) {
			r.ReportError("skip enum", fmt.Sprintf("symbol index %d out of range", i))
		}
	case avro.Array, avro.Map:
		for r.Error == nil {
			n := r.ReadLong()
			if n == 0 || r.Error != nil {
				return
			}
			if n < 0 { // a block with its size in bytes
				n = -n
				r.ReadLong()
			}
			for range n {
				if arr, ok := s.(*avro.ArraySchema); ok {
					skipAvro(r, arr.Items())
					continue
				}
				if k := length("map key"); k > 0 {
					r.SkipNBytes(int(k))
				}
				skipAvro(r, s.(*avro.MapSchema).Values())
			}
		}
	case avro.Record:
		for _, f := range s.(*avro.RecordSchema).Fields() {
			skipAvro(r, f.Type())
		}
	case avro.Union:
		types := s.(*avro.UnionSchema).Types()
		i := r.ReadLong()
		if r.Error == nil && (i < 0 || int(i) >= len(types)) {
			r.ReportError("skip union", fmt.Sprintf("branch index %d out of range", i))
			return
		}
		if r.Error == nil {
			skipAvro(r, types[i])
		}
	default:
		r.ReportError("skip", fmt.Sprintf("Avro type %s is not supported", s.Type()))
	}
}

// checkAvroJSON checks a JSON value against s in Avro's JSON encoding as
// Google's emulator does (with Avro's Java JSON decoder): every record field
// present, even one with a default; fields the record does not have are
// ignored; a non-null union value wrapped as {"type": value}.
func checkAvroJSON(s avro.Schema, v gjson.Result, at string) error {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	bad := func(want string) error { return fmt.Errorf("%s: want %s, got %s", at, want, jsonKind(v)) }
	switch s.Type() {
	case avro.Null:
		if v.Type != gjson.Null {
			return bad("null")
		}
	case avro.Boolean:
		if !v.IsBool() {
			return bad("a boolean")
		}
	case avro.Int, avro.Long:
		// As Avro's Java JSON decoder: a fraction is cut off, a number out
		// of range is refused.
		if v.Type != gjson.Number {
			return bad("an integer")
		}
		f := math.Trunc(v.Num)
		lo, hi := float64(math.MinInt64), float64(math.MaxInt64)
		if s.Type() == avro.Int {
			lo, hi = math.MinInt32, math.MaxInt32
		}
		if f < lo || f > hi {
			return fmt.Errorf("%s: %s is out of the range of an Avro %s", at, v.Raw, s.Type())
		}
	case avro.Float, avro.Double:
		if v.Type != gjson.Number {
			return bad("a number")
		}
	case avro.String:
		if v.Type != gjson.String {
			return bad("a string")
		}
	case avro.Bytes, avro.Fixed:
		if v.Type != gjson.String {
			return bad("a string of bytes")
		}
		n := 0
		for _, r := range v.Str {
			if r > 0xff {
				return fmt.Errorf("%s: character %q is not a byte (Avro JSON writes bytes as code points 0-255)", at, r)
			}
			n++
		}
		if f, ok := s.(*avro.FixedSchema); ok && n != f.Size() {
			return fmt.Errorf("%s: %d bytes, the fixed type %s has %d", at, n, f.FullName(), f.Size())
		}
	case avro.Enum:
		if v.Type != gjson.String {
			return bad("an enum symbol")
		}
		e := s.(*avro.EnumSchema)
		if !slices.Contains(e.Symbols(), v.Str) {
			return fmt.Errorf("%s: %q is not a symbol of %s", at, v.Str, e.FullName())
		}
	case avro.Array:
		if !v.IsArray() {
			return bad("an array")
		}
		var err error
		i := 0
		v.ForEach(func(_, x gjson.Result) bool {
			err = checkAvroJSON(s.(*avro.ArraySchema).Items(), x, fmt.Sprintf("%s[%d]", at, i))
			i++
			return err == nil
		})
		return err
	case avro.Map:
		if !v.IsObject() {
			return bad("an object")
		}
		var err error
		v.ForEach(func(k, x gjson.Result) bool {
			err = checkAvroJSON(s.(*avro.MapSchema).Values(), x, at+"."+k.Str)
			return err == nil
		})
		return err
	case avro.Record:
		if !v.IsObject() {
			return bad("an object")
		}
		rs := s.(*avro.RecordSchema)
		for _, f := range rs.Fields() {
			// Avro names are letters, digits and _, none of which gjson
			// reads as path syntax.
			x := v.Get(f.Name())
			if !x.Exists() {
				return fmt.Errorf("%s: field %q of %s is missing", at, f.Name(), rs.FullName())
			}
			if err := checkAvroJSON(f.Type(), x, at+"."+f.Name()); err != nil {
				return err
			}
		}
	case avro.Union:
		return checkAvroUnion(s.(*avro.UnionSchema), v, at)
	default:
		return fmt.Errorf("%s: Avro type %s is not supported", at, s.Type())
	}
	return nil
}

func checkAvroUnion(u *avro.UnionSchema, v gjson.Result, at string) error {
	if v.Type == gjson.Null {
		if u.Nullable() {
			return nil
		}
		return fmt.Errorf("%s: null is not a branch of the union", at)
	}
	var name, val gjson.Result
	n := 0
	if v.IsObject() {
		v.ForEach(func(k, x gjson.Result) bool { name, val, n = k, x, n+1; return n < 2 })
	}
	if n != 1 {
		return fmt.Errorf(`%s: a union value must be null or {"type": value}, got %s`, at, jsonKind(v))
	}
	for _, branch := range u.Types() {
		if unionBranchName(branch) == name.Str {
			return checkAvroJSON(branch, val, at+"."+name.Str)
		}
	}
	return fmt.Errorf("%s: %q is not a branch of the union", at, name.Str)
}

// unionBranchName is how Avro's JSON encoding names a union branch: the
// full name of a named type, else the type.
func unionBranchName(s avro.Schema) string {
	if r, ok := s.(*avro.RefSchema); ok {
		s = r.Schema()
	}
	if n, ok := s.(avro.NamedSchema); ok {
		return n.FullName()
	}
	return string(s.Type())
}

func jsonKind(v gjson.Result) string {
	switch {
	case v.Type == gjson.Null:
		return "null"
	case v.IsBool():
		return "a boolean"
	case v.Type == gjson.Number:
		return "the number " + v.Raw
	case v.Type == gjson.String:
		if utf8.RuneCountInString(v.Str) > 20 {
			return "a string"
		}
		return fmt.Sprintf("the string %q", v.Str)
	case v.IsArray():
		return "an array"
	default:
		return "an object"
	}
}
