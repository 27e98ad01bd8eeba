package broker

import (
	"slices"
	"strings"

	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/fieldmaskpb"
)

// maskExample is the field each resource's error text shows as the form a
// path takes, as the service words it.
var maskExample = map[protoreflect.Name]string{
	"Topic":        "'schema_settings' rather than 'schemaSettings'",
	"Subscription": "'push_config' rather than 'pushConfig'",
	"Snapshot":     "'expire_time' rather than 'expireTime'",
}

// applyMask copies the fields that mask names from src to dst, as the
// service's Update calls do. A path may be dotted, like
// "schema_settings.schema": it then changes that field of the nested
// message and keeps its siblings. Fields the API marks output-only are
// unknown to an update; those it marks immutable or as the identifier, and
// the ones listed in fixed, are refused. The error texts are the service's.
func applyMask(dst, src proto.Message, mask *fieldmaskpb.FieldMask, fixed ...string) error {
	d, s := dst.ProtoReflect(), src.ProtoReflect()
	kind := d.Descriptor().Name()
	req := "Update" + string(kind) + "Request"
	if len(mask.GetPaths()) == 0 {
		return status.Errorf(codes.InvalidArgument, "The update_mask in the %s must be set, and must contain a non-empty paths list.", req)
	}
	for _, path := range mask.Paths {
		fds, ok := maskFields(d.Descriptor(), path)
		if !ok {
			return status.Errorf(codes.InvalidArgument, "Invalid update_mask provided in the %s: %s is not a known %s field. Note that field paths must be of the form %s.",
				req, path, kind, maskExample[kind])
		}
		for i, fd := range fds {
			name := strings.Join(strings.Split(path, ".")[:i+1], ".")
			if slices.Contains(fixed, name) || hasBehavior(fd, annotations.FieldBehavior_IMMUTABLE, annotations.FieldBehavior_IDENTIFIER) {
				return status.Errorf(codes.InvalidArgument, "Invalid update_mask provided in the %s: the %s field in the %s is not mutable.", req, name, kind)
			}
		}
	}
	for _, path := range mask.Paths {
		fds, _ := maskFields(d.Descriptor(), path)
		copyPath(d, s, fds)
	}
	return nil
}

// maskFields resolves a dotted path to its fields, outermost first. It
// reports false for a name that is not a field, a step through a field that
// is not a singular message, or an output-only field.
func maskFields(md protoreflect.MessageDescriptor, path string) ([]protoreflect.FieldDescriptor, bool) {
	var fds []protoreflect.FieldDescriptor
	for i, part := range strings.Split(path, ".") {
		if i > 0 {
			prev := fds[i-1]
			if prev.Kind() != protoreflect.MessageKind || prev.IsList() || prev.IsMap() {
				return nil, false
			}
			md = prev.Message()
		}
		fd := md.Fields().ByName(protoreflect.Name(part))
		if fd == nil || hasBehavior(fd, annotations.FieldBehavior_OUTPUT_ONLY) {
			return nil, false
		}
		fds = append(fds, fd)
	}
	return fds, true
}

// copyPath sets the field at the end of fds in d to its value in s, or
// clears it when s does not have it; a message missing on the way in s
// counts as an empty one.
func copyPath(d, s protoreflect.Message, fds []protoreflect.FieldDescriptor) {
	fd := fds[0]
	switch {
	case len(fds) == 1 && s.Has(fd):
		d.Set(fd, s.Get(fd))
	case len(fds) == 1:
		d.Clear(fd)
	case s.Has(fd) || d.Has(fd):
		copyPath(d.Mutable(fd).Message(), s.Get(fd).Message(), fds[1:])
	}
}

func hasBehavior(fd protoreflect.FieldDescriptor, want ...annotations.FieldBehavior) bool {
	got, _ := proto.GetExtension(fd.Options(), annotations.E_FieldBehavior).([]annotations.FieldBehavior)
	return slices.ContainsFunc(got, func(b annotations.FieldBehavior) bool { return slices.Contains(want, b) })
}

// clearNotStored drops what a create request sets in fields the API marks
// output-only (the service ignores them and fills them in itself) or
// input-only (it never returns them), here and in nested messages.
func clearNotStored(m protoreflect.Message) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case hasBehavior(fd, annotations.FieldBehavior_OUTPUT_ONLY, annotations.FieldBehavior_INPUT_ONLY):
			m.Clear(fd)
		case fd.Kind() == protoreflect.MessageKind && !fd.IsList() && !fd.IsMap():
			clearNotStored(v.Message())
		}
		return true
	})
}
