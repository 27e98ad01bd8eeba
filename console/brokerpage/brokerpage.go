// Package brokerpage is the console's page for the embedded broker, at
// /broker: topics and their subscriptions with backlog, unacked count,
// oldest unacked age, dead-lettered count and filter or push endpoint,
// updated live; a publish form for any topic; peek at the next messages of
// a subscription without taking them; seek to a time or a snapshot. It
// calls the broker in process, through the same handlers as its RPCs.
package brokerpage

import (
	"context"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/broker"
	"github.com/dedupflow/dedupflow/internal/localguard"
	"github.com/dedupflow/dedupflow/internal/webstatic"
)

//go:embed assets
var assets embed.FS

// Broker is what the page needs of *broker.Broker.
type Broker interface {
	Overview() []broker.TopicStats
	Peek(subscription string, n int) ([]*pb.PubsubMessage, error)
	Publish(ctx context.Context, req *pb.PublishRequest) (*pb.PublishResponse, error)
	Seek(ctx context.Context, req *pb.SeekRequest) (*pb.SeekResponse, error)
}

// Options configure the page.
type Options struct {
	// AllowedHosts are host names, besides localhost and IP literals, the
	// page answers to (see package localguard).
	AllowedHosts []string
	// ConsoleURL, when set, is linked from the page as the way back to the
	// console that serves it (up serves both).
	ConsoleURL string
	Logger     *slog.Logger
}

// The page peeks at peekShown messages; the API takes up to maxPeek.
const (
	maxBodyBytes = 1 << 20
	maxPeek      = 50
	peekShown    = 20
)

// csp allows only the page's own files, so that text that slipped past
// the escaping could not run.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

type page struct {
	b       Broker
	log     *slog.Logger
	token   string
	console string
	tmpl    *template.Template
}

// New returns the handler of /broker and the paths below it.
func New(b Broker, o Options) (http.Handler, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	token, err := localguard.NewToken()
	if err != nil {
		return nil, fmt.Errorf("brokerpage: %w", err)
	}
	tmpl, err := template.ParseFS(assets, "assets/broker.html")
	if err != nil {
		return nil, fmt.Errorf("brokerpage: parse page: %w", err)
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, fmt.Errorf("brokerpage: static files: %w", err)
	}
	p := &page{b: b, log: o.Logger, token: token, console: o.ConsoleURL, tmpl: tmpl}
	post := func(h http.HandlerFunc) http.Handler {
		return localguard.SameSite(true, deny, localguard.Token(token, deny, h))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /broker", p.index)
	mux.Handle("GET /broker/static/", http.StripPrefix("/broker/static/", webstatic.Files(static)))
	mux.HandleFunc("GET /broker/api/state", p.state)
	// Peek changes nothing, but shows message contents: only the page asks.
	mux.Handle("GET /broker/api/peek", localguard.SameSite(false, deny, localguard.Token(token, deny, http.HandlerFunc(p.peek))))
	mux.Handle("POST /broker/api/publish", post(p.publish))
	mux.Handle("POST /broker/api/seek", post(p.seek))
	return localguard.Host(o.AllowedHosts, deny, localguard.PageHeaders(csp, mux)), nil
}

func deny(w http.ResponseWriter, _ *http.Request, code int, msg string) { writeErr(w, code, msg) }

func (p *page) index(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store") // the page holds the token
	if err := p.tmpl.Execute(w, map[string]any{"Token": p.token, "PeekShown": peekShown, "Console": p.console}); err != nil {
		p.log.Warn("broker page: render", "err", err)
	}
}

type subView struct {
	Name          string          `json:"name"`
	Backlog       int             `json:"backlog"`
	Unacked       int             `json:"unacked"`
	OldestUnacked float64         `json:"oldestUnackedSeconds"`
	DeadLettered  int64           `json:"deadLettered"`
	Streams       int             `json:"streams"`
	Filter        string          `json:"filter,omitempty"`
	PushEndpoint  string          `json:"pushEndpoint,omitempty"`
	Detached      bool            `json:"detached,omitempty"`
	Transforms    []transformView `json:"transforms,omitempty"`
	Export        *exportView     `json:"export,omitempty"`
}

// exportView is what a BigQuery or Cloud Storage subscription wrote.
type exportView struct {
	Kind        string `json:"kind"`
	Destination string `json:"destination"`
	State       string `json:"state"`
	Reason      string `json:"reason,omitempty"`
	Writes      int64  `json:"writes"`
	Messages    int64  `json:"messages"`
	Failed      int64  `json:"failed"`
	Errors      int64  `json:"errors"`
}

type transformView struct {
	Function string `json:"function"`
	Disabled bool   `json:"disabled,omitempty"`
	Filtered int64  `json:"filtered"`
	Failed   int64  `json:"failed"`
}

func transformViews(ts []broker.TransformStats) []transformView {
	var out []transformView
	for _, t := range ts {
		out = append(out, transformView{Function: t.Function, Disabled: t.Disabled, Filtered: t.Filtered, Failed: t.Failed})
	}
	return out
}

type topicView struct {
	Name          string          `json:"name"`
	Schema        string          `json:"schema,omitempty"`
	Transforms    []transformView `json:"transforms,omitempty"`
	Subscriptions []subView       `json:"subscriptions"`
}

func exportViewOf(e *broker.ExportStats) *exportView {
	if e == nil {
		return nil
	}
	return &exportView{Kind: e.Kind, Destination: e.Destination, State: e.State, Reason: e.Reason,
		Writes: e.Batches, Messages: e.Messages, Failed: e.Failed, Errors: e.Errors}
}

func (p *page) state(w http.ResponseWriter, _ *http.Request) {
	topics := []topicView{}
	for _, t := range p.b.Overview() {
		tv := topicView{Name: t.Name, Schema: t.Schema, Transforms: transformViews(t.Transforms), Subscriptions: []subView{}}
		for _, s := range t.Subscriptions {
			tv.Subscriptions = append(tv.Subscriptions, subView{
				Name: s.Name, Backlog: s.Backlog, Unacked: s.Unacked, OldestUnacked: s.OldestUnacked.Seconds(),
				DeadLettered: s.DeadLettered, Streams: s.Streams, Filter: s.Filter, PushEndpoint: s.PushEndpoint, Detached: s.Detached,
				Transforms: transformViews(s.Transforms), Export: exportViewOf(s.Export),
			})
		}
		topics = append(topics, tv)
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]any{"topics": topics})
}

type messageView struct {
	ID          string            `json:"messageId"`
	PublishTime string            `json:"publishTime"`
	Data        string            `json:"data"`
	Base64      bool              `json:"base64,omitempty"` // data was not UTF-8
	Attributes  map[string]string `json:"attributes,omitempty"`
	OrderingKey string            `json:"orderingKey,omitempty"`
}

func (p *page) peek(w http.ResponseWriter, r *http.Request) {
	n, err := strconv.Atoi(r.URL.Query().Get("n"))
	if err != nil || n < 1 || n > maxPeek {
		n = 10
	}
	msgs, err := p.b.Peek(r.URL.Query().Get("subscription"), n)
	if err != nil {
		writeStatus(w, err)
		return
	}
	out := []messageView{}
	for _, m := range msgs {
		v := messageView{ID: m.MessageId, PublishTime: m.PublishTime.AsTime().UTC().Format(time.RFC3339Nano),
			Attributes: m.Attributes, OrderingKey: m.OrderingKey, Data: string(m.Data)}
		if !utf8.Valid(m.Data) {
			v.Data, v.Base64 = base64.StdEncoding.EncodeToString(m.Data), true
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"messages": out})
}

// publish takes the topic, the data and attributes as "key=value" lines;
// the broker checks the message as it checks any publish.
func (p *page) publish(w http.ResponseWriter, r *http.Request) {
	if !p.form(w, r) {
		return
	}
	attrs := map[string]string{}
	for i, line := range strings.Split(r.PostForm.Get("attributes"), "\n") {
		line = strings.TrimRight(line, "\r")
		if strings.TrimSpace(line) == "" {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			writeErr(w, http.StatusBadRequest, fmt.Sprintf("attributes, line %d: want key=value", i+1))
			return
		}
		attrs[k] = v
	}
	resp, err := p.b.Publish(r.Context(), &pb.PublishRequest{Topic: r.PostForm.Get("topic"),
		Messages: []*pb.PubsubMessage{{Data: []byte(r.PostForm.Get("data")), Attributes: attrs}}})
	if err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"messageIds": resp.MessageIds})
}

// seek takes the subscription and either an RFC 3339 time or a snapshot.
func (p *page) seek(w http.ResponseWriter, r *http.Request) {
	if !p.form(w, r) {
		return
	}
	req := &pb.SeekRequest{Subscription: r.PostForm.Get("subscription")}
	at, snap := strings.TrimSpace(r.PostForm.Get("time")), strings.TrimSpace(r.PostForm.Get("snapshot"))
	switch {
	case at != "" && snap != "":
		writeErr(w, http.StatusBadRequest, "seek to a time or to a snapshot, not both")
		return
	case snap != "":
		req.Target = &pb.SeekRequest_Snapshot{Snapshot: snap}
	case at != "":
		t, err := time.Parse(time.RFC3339Nano, at)
		if err != nil {
			writeErr(w, http.StatusBadRequest, fmt.Sprintf("time %q: want RFC 3339, a date, T, a time and Z for UTC or an offset, as in 2026-03-01T09:30:00Z or 2026-03-01T10:30:00+01:00", at))
			return
		}
		req.Target = &pb.SeekRequest_Time{Time: timestamppb.New(t)}
	default:
		writeErr(w, http.StatusBadRequest, "give a time or a snapshot to seek to")
		return
	}
	if _, err := p.b.Seek(r.Context(), req); err != nil {
		writeStatus(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"subscription": req.Subscription})
}

func (p *page) form(w http.ResponseWriter, r *http.Request) bool {
	r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
	if err := r.ParseForm(); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeErr(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request larger than %d KiB", maxBodyBytes>>10))
			return false
		}
		writeErr(w, http.StatusBadRequest, "unreadable form: "+err.Error())
		return false
	}
	return true
}

// writeStatus answers with the broker's own message: the page shows why.
func writeStatus(w http.ResponseWriter, err error) {
	writeErr(w, http.StatusBadRequest, status.Convert(err).Message())
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
