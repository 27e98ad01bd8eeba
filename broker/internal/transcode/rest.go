// Package transcode transcodes Pub/Sub's v1 REST API, its JSON surface, to the
// gRPC services that implement it. Its routes are read from the
// google.api.http annotations of the services' descriptors, so every RPC
// with a REST binding is served by the very implementation the gRPC server
// calls. Requests are decoded and answers and errors written as the
// service does: the body, the query's binds and the path fill the request,
// in that order; the system parameters (params.go) shape the answer; an
// error is {"error":{"code":404,"message":"...","status":"NOT_FOUND"}}.
package transcode

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/genproto/googleapis/api/annotations"
	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// BodyBytes bounds a request body: a publish of RequestBytes, grown by
// base64 and JSON.
const BodyBytes = limits.RequestBytes*4/3 + 1<<20

// Service is a gRPC service and its implementation, with REST bindings
// beyond those its descriptor declares, by method name.
type Service struct {
	Desc *grpc.ServiceDesc
	Impl any
	More map[string][]*annotations.HttpRule
}

// route is one binding of an RPC to an HTTP method and path template.
type route struct {
	verb   string   // HTTP method
	segs   []string // literal, "*" (one segment) or "**" (the rest)
	vars   []pathVar
	custom string // the ":verb" suffix of the last segment, without ':'
	body   string // "" (none), "*" (the request) or the request field it fills
	rpc    protoreflect.FullName
	call   func(ctx context.Context, dec func(any) error) (any, error)
}

// pathVar binds segs[from:to] to a (dotted) request field.
type pathVar struct {
	field    string
	from, to int
}

// routes reads the routes of services from their descriptors. Routes
// with a custom verb come first: "/schemas/s:listRevisions" must not be
// taken as GetSchema of a schema named "s:listRevisions".
func routes(services []Service) ([]*route, error) {
	var rs []*route
	for _, svc := range services {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc.Desc.ServiceName))
		if err != nil {
			return nil, fmt.Errorf("descriptor of %s: %w", svc.Desc.ServiceName, err)
		}
		sd := d.(protoreflect.ServiceDescriptor)
		for _, m := range svc.Desc.Methods {
			md := sd.Methods().ByName(protoreflect.Name(m.MethodName))
			if md == nil {
				return nil, fmt.Errorf("%s has no method %s", sd.FullName(), m.MethodName)
			}
			rule, _ := proto.GetExtension(md.Options(), annotations.E_Http).(*annotations.HttpRule)
			if rule == nil {
				continue // streaming RPCs have no REST binding
			}
			impl, h := svc.Impl, m.Handler
			call := func(ctx context.Context, dec func(any) error) (any, error) { return h(impl, ctx, dec, nil) }
			rules := append([]*annotations.HttpRule{rule}, rule.AdditionalBindings...)
			for _, r := range append(rules, svc.More[m.MethodName]...) {
				rt, err := newRoute(r)
				if err != nil {
					return nil, fmt.Errorf("REST binding of %s: %w", md.FullName(), err)
				}
				rt.rpc, rt.call = md.FullName(), call
				rs = append(rs, rt)
			}
		}
	}
	slices.SortStableFunc(rs, func(a, b *route) int {
		if (a.custom != "") == (b.custom != "") {
			return 0
		}
		if a.custom != "" {
			return -1
		}
		return 1
	})
	return rs, nil
}

func newRoute(r *annotations.HttpRule) (*route, error) {
	rt := &route{body: r.Body}
	var tmpl string
	switch p := r.Pattern.(type) {
	case *annotations.HttpRule_Get:
		rt.verb, tmpl = http.MethodGet, p.Get
	case *annotations.HttpRule_Put:
		rt.verb, tmpl = http.MethodPut, p.Put
	case *annotations.HttpRule_Post:
		rt.verb, tmpl = http.MethodPost, p.Post
	case *annotations.HttpRule_Delete:
		rt.verb, tmpl = http.MethodDelete, p.Delete
	case *annotations.HttpRule_Patch:
		rt.verb, tmpl = http.MethodPatch, p.Patch
	case *annotations.HttpRule_Custom:
		rt.verb, tmpl = p.Custom.Kind, p.Custom.Path
	default:
		return nil, errors.New("no HTTP pattern")
	}
	return rt, rt.parse(tmpl)
}

// parse reads a path template: "/v1/{topic=projects/*/topics/*}:publish".
func (rt *route) parse(tmpl string) error {
	t, ok := strings.CutPrefix(tmpl, "/")
	if !ok {
		return fmt.Errorf("template %q does not start with /", tmpl)
	}
	if i := strings.LastIndexByte(t, ':'); i > strings.LastIndexAny(t, "/}") {
		rt.custom, t = t[i+1:], t[:i]
	}
	for t != "" {
		if strings.HasPrefix(t, "{") {
			end := strings.IndexByte(t, '}')
			if end < 0 {
				return fmt.Errorf("template %q: unclosed {", tmpl)
			}
			field, pat, ok := strings.Cut(t[1:end], "=")
			if !ok {
				pat = "*"
			}
			v := pathVar{field: field, from: len(rt.segs)}
			rt.segs = append(rt.segs, strings.Split(pat, "/")...)
			v.to = len(rt.segs)
			rt.vars = append(rt.vars, v)
			t = t[end+1:]
		} else {
			seg, rest, _ := strings.Cut(t, "/")
			rt.segs = append(rt.segs, seg)
			t = "/" + rest
			if rest == "" {
				t = ""
			}
		}
		t = strings.TrimPrefix(t, "/")
	}
	for i, s := range rt.segs {
		if s == "**" && i != len(rt.segs)-1 {
			return fmt.Errorf("template %q: ** must come last", tmpl)
		}
	}
	return nil
}

// match reports whether the path segments fit the template, and the values
// of its variables.
func (rt *route) match(segs []string) (map[string]string, bool) {
	if rt.custom != "" {
		last, ok := strings.CutSuffix(segs[len(segs)-1], ":"+rt.custom)
		if !ok {
			return nil, false
		}
		segs = append(segs[:len(segs)-1:len(segs)-1], last)
	}
	multi := len(rt.segs) > 0 && rt.segs[len(rt.segs)-1] == "**"
	if len(segs) != len(rt.segs) && !(multi && len(segs) >= len(rt.segs)) {
		return nil, false
	}
	for i, p := range rt.segs {
		switch {
		case p == "**":
		case segs[i] == "":
			return nil, false
		case p != "*" && p != segs[i]:
			return nil, false
		}
	}
	vals := make(map[string]string, len(rt.vars))
	for _, v := range rt.vars {
		to := v.to
		if multi && to == len(rt.segs) {
			to = len(segs)
		}
		vals[v.field] = strings.Join(segs[v.from:to], "/")
	}
	return vals, true
}

// Handler serves the REST API of its services.
type Handler struct {
	routes []*route
	first  func(w http.ResponseWriter, r *http.Request, segs []string) bool
}

// NewHandler serves services. first, if not nil, sees each request's path
// segments before the routes do, and reports whether it served the request
// (calls that have no gRPC method to transcode to).
func NewHandler(services []Service, first func(w http.ResponseWriter, r *http.Request, segs []string) bool) (*Handler, error) {
	rs, err := routes(services)
	if err != nil {
		return nil, err
	}
	return &Handler{routes: rs, first: first}, nil
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	segs, err := pathSegments(r.URL.EscapedPath())
	if err != nil {
		WriteStatus(w, status.New(codes.InvalidArgument, err.Error()))
		return
	}
	if h.first != nil && h.first(w, r, segs) {
		return
	}
	sys, binds, err := readQuery(r.URL.RawQuery)
	if err != nil {
		st, _ := status.FromError(err)
		WriteStatus(w, st)
		return
	}
	var allowed []string
	for _, rt := range h.routes {
		vals, ok := rt.match(segs)
		if !ok {
			continue
		}
		if rt.verb != r.Method {
			allowed = append(allowed, rt.verb)
			continue
		}
		resp, err := rt.call(r.Context(), func(req any) error {
			return rt.decode(w, r, vals, binds, req.(proto.Message))
		})
		if err != nil {
			st, _ := status.FromError(err)
			WriteStatus(w, st)
			return
		}
		sys.write(w, resp.(proto.Message))
		return
	}
	// As the service does, a path that no method takes, or not with this
	// HTTP method, is not found; Allow says which methods it takes.
	msg := fmt.Sprintf("%s %s is not a method of the Pub/Sub v1 REST API", r.Method, r.URL.Path)
	if len(allowed) > 0 {
		slices.Sort(allowed)
		allowed = slices.Compact(allowed)
		w.Header().Set("Allow", strings.Join(allowed, ", "))
		msg += fmt.Sprintf(" (this path takes %s)", strings.Join(allowed, ", "))
	}
	WriteStatus(w, status.New(codes.NotFound, msg))
}

func pathSegments(p string) ([]string, error) {
	rest, ok := strings.CutPrefix(p, "/")
	if !ok {
		return nil, fmt.Errorf("path %q does not start with /", p)
	}
	segs := strings.Split(rest, "/")
	for i, s := range segs {
		u, err := url.PathUnescape(s)
		if err != nil {
			return nil, fmt.Errorf("path segment %q: %w", s, err)
		}
		segs[i] = u
	}
	return segs, nil
}

// decode fills req from the body, the query's binds and the path, in that
// order, as the HTTP rule says; errors are the service's words.
func (rt *route) decode(w http.ResponseWriter, r *http.Request, vals map[string]string, binds [][2]string, req proto.Message) error {
	m := req.ProtoReflect()
	if rt.body != "" {
		data, err := ReadBody(w, r)
		if err != nil {
			return err
		}
		target := req
		if rt.body != "*" {
			fd := fieldByName(m, rt.body)
			if fd == nil || fd.Message() == nil {
				return status.Errorf(codes.Internal, "REST body field %q is not a message of %s", rt.body, m.Descriptor().FullName())
			}
			target = m.Mutable(fd).Message().Interface()
		}
		if len(strings.TrimSpace(string(data))) > 0 {
			if err := protojson.Unmarshal(data, target); err != nil {
				return status.Errorf(codes.InvalidArgument, "Invalid JSON payload received. %s", strings.TrimSpace(strings.TrimPrefix(err.Error(), "proto:")))
			}
		}
	}
	if rt.body != "*" {
		for _, kv := range binds {
			if err := setField(m, kv[0], kv[1]); err != nil {
				return err
			}
		}
	}
	for _, v := range rt.vars {
		if err := setField(m, v.field, vals[v.field]); err != nil {
			return err
		}
	}
	return nil
}

// ReadBody reads a request body of at most BodyBytes, gunzipping it when
// the client sent it compressed, as Google's Java API clients (Beam's
// PubsubIO among them) do with every request.
func ReadBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	body := io.Reader(http.MaxBytesReader(w, r.Body, BodyBytes))
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "read gzip request body: %v", err)
		}
		defer zr.Close()
		// The bound holds for what the body unpacks to, not only what was sent.
		body = io.LimitReader(zr, BodyBytes+1)
	default:
		return nil, status.Errorf(codes.InvalidArgument, "unsupported request Content-Encoding %q: send the body as is or with gzip", enc)
	}
	data, err := io.ReadAll(body)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "read request body: %v", err)
	}
	if len(data) > BodyBytes {
		return nil, status.Errorf(codes.InvalidArgument, "request body unpacks to more than %d bytes", BodyBytes)
	}
	return data, nil
}

func fieldByName(m protoreflect.Message, name string) protoreflect.FieldDescriptor {
	fields := m.Descriptor().Fields()
	if fd := fields.ByName(protoreflect.Name(name)); fd != nil {
		return fd
	}
	return fields.ByJSONName(name)
}

// setField sets the field at a dotted path from its text form in a URL.
func setField(m protoreflect.Message, path, v string) error {
	parts := strings.Split(path, ".")
	for i, p := range parts {
		fd := fieldByName(m, p)
		if fd == nil || fd.IsMap() || (i < len(parts)-1 && (fd.Message() == nil || fd.IsList())) {
			return status.Errorf(codes.InvalidArgument,
				"Invalid JSON payload received. Unknown name %q: Cannot bind query parameter. Field %q could not be found in request message.", path, p)
		}
		if i < len(parts)-1 {
			m = m.Mutable(fd).Message()
			continue
		}
		val, err := parseValue(m, fd, v)
		if err != nil {
			return status.Errorf(codes.InvalidArgument, "Invalid value at '%s' (TYPE_%s), %q", path, strings.ToUpper(fd.Kind().String()), v)
		}
		if fd.IsList() {
			m.Mutable(fd).List().Append(val)
		} else {
			m.Set(fd, val)
		}
	}
	return nil
}

func parseValue(m protoreflect.Message, fd protoreflect.FieldDescriptor, v string) (protoreflect.Value, error) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(v), nil
	case protoreflect.BoolKind:
		x, err := strconv.ParseBool(v)
		return protoreflect.ValueOfBool(x), err
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		x, err := strconv.ParseInt(v, 10, 32)
		return protoreflect.ValueOfInt32(int32(x)), err
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		x, err := strconv.ParseInt(v, 10, 64)
		return protoreflect.ValueOfInt64(x), err
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		x, err := strconv.ParseUint(v, 10, 32)
		return protoreflect.ValueOfUint32(uint32(x)), err
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		x, err := strconv.ParseUint(v, 10, 64)
		return protoreflect.ValueOfUint64(x), err
	case protoreflect.FloatKind:
		x, err := strconv.ParseFloat(v, 32)
		return protoreflect.ValueOfFloat32(float32(x)), err
	case protoreflect.DoubleKind:
		x, err := strconv.ParseFloat(v, 64)
		return protoreflect.ValueOfFloat64(x), err
	}
	// Enums, bytes and messages (timestamps, field masks) take their JSON
	// form; a JSON string holding the text is what the service accepts.
	q, _ := json.Marshal(v)
	holder := m.New()
	if err := (protojson.UnmarshalOptions{}).Unmarshal(fmt.Appendf(nil, `{%q:%s}`, fd.JSONName(), q), holder.Interface()); err != nil {
		return protoreflect.Value{}, err
	}
	if fd.IsList() {
		return holder.Get(fd).List().Get(0), nil
	}
	return holder.Get(fd), nil
}

// httpStatus maps gRPC codes to HTTP statuses as google/rpc/code.proto
// documents them.
var httpStatus = map[codes.Code]int{
	codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400,
	codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409,
	codes.PermissionDenied: 403, codes.Unauthenticated: 401, codes.ResourceExhausted: 429,
	codes.FailedPrecondition: 400, codes.Aborted: 409, codes.OutOfRange: 400,
	codes.Unimplemented: 501, codes.Internal: 500, codes.Unavailable: 503, codes.DataLoss: 500,
}

func WriteStatus(w http.ResponseWriter, st *status.Status) {
	code, ok := httpStatus[st.Code()]
	if !ok {
		code = 500
	}
	WriteError(w, code, st.Code(), st.Message())
}

// WriteError writes the service's error body:
// {"error":{"code":404,"message":"...","status":"NOT_FOUND"}}.
func WriteError(w http.ResponseWriter, httpCode int, c codes.Code, msg string) {
	body, _ := json.Marshal(map[string]any{"error": map[string]any{
		"code": httpCode, "message": msg, "status": rpccode.Code(c).String(),
	}})
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(httpCode)
	_, _ = w.Write(body)
}
