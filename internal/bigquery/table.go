package bigquery

import (
	"fmt"
	"strings"

	"cloud.google.com/go/bigquery"
	"cloud.google.com/go/bigquery/storage/apiv1/storagepb"
	"cloud.google.com/go/bigquery/storage/managedwriter/adapt"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
)

// Table is a table's schema and the proto message its rows are sent as.
type Table struct {
	Project string
	Ref     TableRef
	Schema  bigquery.Schema
	msg     protoreflect.MessageDescriptor
	desc    *descriptorpb.DescriptorProto // msg, self-contained, for the stream
}

// stringTypes are sent as their canonical text, which the Storage Write
// API accepts for them, instead of adapt's packed integers and byte
// encodings, which a JSON payload never holds.
var stringTypes = []storagepb.TableFieldSchema_Type{
	storagepb.TableFieldSchema_DATETIME, storagepb.TableFieldSchema_TIME,
	storagepb.TableFieldSchema_NUMERIC, storagepb.TableFieldSchema_BIGNUMERIC,
}

func newTable(project string, ref TableRef, s bigquery.Schema) (*Table, error) {
	if len(s) == 0 {
		return nil, fmt.Errorf("table %s.%s has no columns", project, ref)
	}
	ss, err := adapt.BQSchemaToStorageTableSchema(s)
	if err != nil {
		return nil, fmt.Errorf("table %s.%s: schema: %w", project, ref, err)
	}
	var opts []adapt.ProtoConversionOption
	for _, t := range stringTypes {
		opts = append(opts, adapt.WithProtoMapping(adapt.ProtoMapping{FieldType: t, Type: descriptorpb.FieldDescriptorProto_TYPE_STRING}))
	}
	d, err := adapt.StorageSchemaToProtoDescriptorWithOptions(ss, "root", opts...)
	if err != nil {
		return nil, fmt.Errorf("table %s.%s: schema: %w", project, ref, err)
	}
	md, ok := d.(protoreflect.MessageDescriptor)
	if !ok {
		return nil, fmt.Errorf("table %s.%s: schema gave a %T, not a message", project, ref, d)
	}
	dp, err := adapt.NormalizeDescriptor(md)
	if err != nil {
		return nil, fmt.Errorf("table %s.%s: schema: %w", project, ref, err)
	}
	return &Table{Project: project, Ref: ref, Schema: s, msg: md, desc: dp}, nil
}

// Column is the top-level column named name (BigQuery's names ignore
// case), or nil.
func (t *Table) Column(name string) *bigquery.FieldSchema {
	if i := column(t.Schema, name); i >= 0 {
		return t.Schema[i]
	}
	return nil
}

func column(s bigquery.Schema, name string) int {
	for i, f := range s {
		if strings.EqualFold(f.Name, name) {
			return i
		}
	}
	return -1
}

// String is the table as a query names it.
func (t *Table) String() string { return t.Project + "." + t.Ref.String() }

// Fits checks, before any message, that rows made with meta's columns and
// o fit the table: each metadata column exists with a type its value can
// take, and without o.UseTableSchema every REQUIRED column is one of them
// (nothing else fills it), and each of o.Fields is a column. The error
// names the column.
func (t *Table) Fits(meta []Value, o Options) error {
	for _, v := range meta {
		f := t.Column(v.Column)
		if f == nil {
			return fmt.Errorf("table %s has no column %s", t, v.Column)
		}
		if !accepts(f, v.V) {
			return fmt.Errorf("table %s: column %s is %s, which cannot hold %s", t, f.Name, typeName(f), kindOf(v.V))
		}
	}
	for _, f := range o.Fields {
		if t.Column(f) == nil {
			return fmt.Errorf("table %s has no column %s for the payload's field of that name", t, f)
		}
	}
	if o.UseTableSchema {
		return nil
	}
	for _, f := range t.Schema {
		if f.Required && !hasValue(meta, f.Name) {
			return fmt.Errorf("table %s: column %s is REQUIRED, and only the payload's fields (use_table_schema) could fill it", t, f.Name)
		}
	}
	return nil
}

func hasValue(meta []Value, name string) bool {
	for _, v := range meta {
		if strings.EqualFold(v.Column, name) {
			return true
		}
	}
	return false
}

func typeName(f *bigquery.FieldSchema) string {
	if f.Repeated {
		return "ARRAY<" + string(f.Type) + ">"
	}
	return string(f.Type)
}
