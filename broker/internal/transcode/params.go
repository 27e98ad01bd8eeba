package transcode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// systemParams are the query parameters Google's API front end takes for
// itself (https://cloud.google.com/apis/docs/system-parameters and the
// discovery documents' common parameters). Each may also be spelt with a
// leading '$', which is how Google's REST client libraries send them.
var systemParams = map[string]bool{
	"alt": true, "prettyPrint": true, ".xgafv": true, "apiFormat": true, "fields": true,
	"key": true, "access_token": true, "oauth_token": true, "callback": true,
	"quotaUser": true, "userProject": true, "requestReason": true, "apiVersion": true,
	"ct": true, "httpMethod": true, "outputDefaults": true, "unique": true,
	"upload_protocol": true, "uploadType": true, "userIp": true,
}

// sysParams are the system parameters of a request that change its answer.
type sysParams struct {
	proto    bool // alt=proto: the response in the protobuf wire format
	enumInts bool // alt=json;enum-encoding=int: enums as numbers
	pretty   bool
	fields   selection // nil: every field
}

// readQuery splits a raw query string into the system parameters and the
// pairs that bind request fields. It splits at '&' only: Java's HTTP/JSON
// transport sends "$alt=json;enum-encoding=int" with a bare ';', which is
// part of the value, not a separator.
func readQuery(raw string) (sysParams, [][2]string, error) {
	var sys sysParams
	var binds [][2]string
	for pair := range strings.SplitSeq(raw, "&") {
		if pair == "" {
			continue
		}
		rk, rv, _ := strings.Cut(pair, "=")
		k, err := url.QueryUnescape(rk)
		if err != nil {
			return sys, nil, status.Errorf(codes.InvalidArgument, "query parameter %q: %v", rk, err)
		}
		v, err := url.QueryUnescape(rv)
		if err != nil {
			return sys, nil, status.Errorf(codes.InvalidArgument, "value of query parameter %q: %v", k, err)
		}
		name := strings.TrimPrefix(k, "$")
		if !systemParams[name] {
			binds = append(binds, [2]string{k, v})
			continue
		}
		if err := sys.set(name, v); err != nil {
			return sys, nil, status.Errorf(codes.InvalidArgument, "system parameter %s=%q: %v", k, v, err)
		}
	}
	return sys, binds, nil
}

func (p *sysParams) set(name, v string) error {
	switch name {
	case "alt":
		format, opts, _ := strings.Cut(v, ";")
		switch format {
		case "json", "":
		case "proto":
			p.proto = true
		default:
			return fmt.Errorf("this server answers alt=json or alt=proto")
		}
		for opt := range strings.SplitSeq(opts, ";") {
			switch opt {
			case "", "enum-encoding=string":
			case "enum-encoding=int":
				p.enumInts = true
			default:
				return fmt.Errorf("unknown option %q (enum-encoding=int or enum-encoding=string)", opt)
			}
		}
	case "prettyPrint":
		switch v {
		case "true", "1", "":
			p.pretty = true
		case "false", "0":
			p.pretty = false
		default:
			return fmt.Errorf("want true or false")
		}
	case ".xgafv", "apiFormat":
		if v != "1" && v != "2" {
			return fmt.Errorf("the error format is 1 or 2")
		}
	case "fields":
		sel, err := parseSelection(v)
		if err != nil {
			return err
		}
		p.fields = sel
	}
	// The rest name credentials, quota and tracing that a local broker has
	// no use for; a JSONP callback is not honoured, as it would hand a
	// foreign web page the answer.
	return nil
}

// write writes resp in the format the parameters ask for.
func (p sysParams) write(w http.ResponseWriter, resp proto.Message) {
	if p.proto {
		out, err := proto.Marshal(resp)
		if err != nil {
			WriteStatus(w, status.New(codes.Internal, "encode response: "+err.Error()))
			return
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
		return
	}
	out, err := protojson.MarshalOptions{UseEnumNumbers: p.enumInts}.Marshal(resp)
	if err == nil && p.fields != nil {
		out, err = p.fields.filterJSON(out)
	}
	if err == nil && p.pretty {
		var buf bytes.Buffer
		if err = json.Indent(&buf, out, "", "  "); err == nil {
			out = buf.Bytes()
		}
	}
	if err != nil {
		WriteStatus(w, status.New(codes.Internal, "encode response: "+err.Error()))
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(out)
}

// selection is a partial response's field selection, "fields=a,b/c,d(e,f)":
// each named field maps to what is selected inside it (nil: all of it).
type selection map[string]selection

func parseSelection(s string) (selection, error) {
	sel := selection{}
	rest, err := sel.parse(strings.TrimSpace(s))
	if err != nil {
		return nil, err
	}
	if rest != "" {
		return nil, fmt.Errorf("unexpected %q", rest)
	}
	return sel, nil
}

// parse reads a comma-separated list of paths, each with an optional
// parenthesised sub-selection, up to an unmatched ')' or the end.
func (sel selection) parse(s string) (string, error) {
	for {
		end := strings.IndexAny(s, ",()")
		if end < 0 {
			end = len(s)
		}
		path := strings.TrimSpace(s[:end])
		if path == "" {
			return s, fmt.Errorf("empty field name in the selection")
		}
		leaf := sel
		names := strings.Split(path, "/")
		for i, n := range names {
			n = jsonName(n)
			if i == len(names)-1 {
				break
			}
			if leaf[n] == nil {
				leaf[n] = selection{}
			}
			leaf = leaf[n]
		}
		last := jsonName(names[len(names)-1])
		s = s[end:]
		if strings.HasPrefix(s, "(") {
			sub := leaf[last]
			if sub == nil {
				sub = selection{}
			}
			rest, err := sub.parse(s[1:])
			if err != nil {
				return rest, err
			}
			if !strings.HasPrefix(rest, ")") {
				return rest, fmt.Errorf("unclosed ( in the selection")
			}
			leaf[last], s = sub, rest[1:]
		} else if _, ok := leaf[last]; !ok {
			leaf[last] = nil
		}
		if !strings.HasPrefix(s, ",") {
			return s, nil
		}
		s = s[1:]
	}
}

// jsonName takes a field as the proto names it (ack_ids) or as JSON does
// (ackIds) to its JSON name.
func jsonName(n string) string {
	parts := strings.Split(strings.TrimSpace(n), "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

// filterJSON keeps only the selected fields of a JSON object.
func (sel selection) filterJSON(in []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(in))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, err
	}
	return json.Marshal(sel.apply(v))
}

func (sel selection) apply(v any) any {
	switch x := v.(type) {
	case []any:
		for i := range x {
			x[i] = sel.apply(x[i])
		}
		return x
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			sub, ok := sel[k]
			if !ok {
				sub, ok = sel["*"]
			}
			if !ok {
				continue
			}
			if sub != nil {
				val = sub.apply(val)
			}
			out[k] = val
		}
		return out
	}
	return v
}

// KeepSemicolons lets a bare ';' through to readQuery as it was sent. Go's
// server would otherwise log a warning for each such request (and its
// query parser drop the pair).
func KeepSemicolons(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw := r.URL.RawQuery
		http.AllowQuerySemicolons(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.URL.RawQuery = raw
			h.ServeHTTP(w, r)
		})).ServeHTTP(w, r)
	})
}
