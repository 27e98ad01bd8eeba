package console

import (
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/internal/advice"
	"github.com/dedupflow/dedupflow/internal/localguard"
	"github.com/dedupflow/dedupflow/internal/webstatic"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/limits"
)

//go:embed assets
var assets embed.FS

// Limits of the publish form. The message limit is the console's, far below
// Pub/Sub's 10 MB: it is a form for typing. The key is an attribute value,
// so its limit is Pub/Sub's (limits.AttributeValueBytes).
const (
	maxBodyBytes    = 64 << 10
	maxMessageBytes = 10 << 10
	maxCopies       = 10
)

// csp allows only the console's own files: even if some text slipped past
// the escaping, an injected script or inline handler would not run.
const csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

func (c *Console) routes() (http.Handler, error) {
	page, err := template.ParseFS(assets, "assets/index.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse page: %w", err)
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		return nil, fmt.Errorf("console: static files: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { c.index(w, r, page) })
	mux.Handle("GET /static/", http.StripPrefix("/static/", webstatic.Files(static)))
	mux.HandleFunc("GET /api/events", c.events)
	// Only the state-changing endpoints need the cross-site checks; the
	// browser will not let another origin read the GET responses.
	mux.Handle("POST /api/publish", c.guard(http.HandlerFunc(c.publish)))
	mux.Handle("POST /api/redeliver", c.guard(http.HandlerFunc(c.redeliver)))
	if c.o.BrokerPage != nil {
		mux.Handle("/broker", c.o.BrokerPage)
		mux.Handle("/broker/", c.o.BrokerPage)
	}
	return localguard.Host(c.o.AllowedHosts, deny, localguard.PageHeaders(csp, mux)), nil
}

// guard admits only same-origin requests that carry the page's CSRF token,
// and bounds the body.
func (c *Console) guard(h http.Handler) http.Handler {
	return localguard.SameSite(true, deny, localguard.Token(c.token, deny, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxBodyBytes)
		if err := r.ParseForm(); err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeErr(w, http.StatusRequestEntityTooLarge, "", fmt.Sprintf("request larger than %d KiB", maxBodyBytes>>10))
				return
			}
			writeErr(w, http.StatusBadRequest, "", "unreadable form: "+err.Error())
			return
		}
		h.ServeHTTP(w, r)
	})))
}

func deny(w http.ResponseWriter, _ *http.Request, code int, msg string) {
	if code == http.StatusMisdirectedRequest {
		// The page is opened by hand: a plain-text answer, addressed to a person.
		http.Error(w, msg+" (open the console by its IP address or as localhost)", code)
		return
	}
	writeErr(w, code, "", msg)
}

type pageData struct {
	Token, Input, Output, Destination, PipelineSub, OutputSub, IDAttribute, EventTimeAttribute, Horizon string
	MaxKey, MaxMessage, MaxCopies                                                                       int
	BrokerPage                                                                                          bool
}

func (c *Console) index(w http.ResponseWriter, r *http.Request, page *template.Template) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store") // the page holds the token
	err := page.Execute(w, pageData{
		Token: c.token, Input: c.o.InputTopic.ID, Output: c.o.OutputTopic.ID, Destination: c.o.Destination,
		PipelineSub: c.o.PipelineSubscription.ID, OutputSub: c.o.OutputSubscription.ID,
		IDAttribute: c.o.IDAttribute, EventTimeAttribute: c.o.EventTimeAttribute,
		Horizon: advice.Short(c.o.Horizon), MaxKey: limits.AttributeValueBytes, MaxMessage: maxMessageBytes, MaxCopies: maxCopies,
		BrokerPage: c.o.BrokerPage != nil,
	})
	if err != nil {
		c.log.Warn("console: render page", "err", err)
	}
}

// fieldError is a validation failure of one form field.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

type publishForm struct {
	message, key string
	copies       int
}

// validate reads the form. Each failure names its field, so the page can
// show the message next to it.
func validate(message, key, copies string) (publishForm, *fieldError) {
	f := publishForm{message: message, key: key, copies: 1}
	switch {
	case message == "":
		return f, &fieldError{"message", "Enter a message."}
	case !utf8.ValidString(message):
		return f, &fieldError{"message", "The message is not valid UTF-8."}
	case len(message) > maxMessageBytes:
		return f, &fieldError{"message", fmt.Sprintf("The message is %d bytes; the console sends at most %d.", len(message), maxMessageBytes)}
	}
	if err := dedup.CheckKey(key); err != nil {
		// The pipeline's own words: it would refuse the message for them.
		return f, &fieldError{"key", "The pipeline refuses this key: " + err.Error() + "."}
	}
	switch {
	case strings.TrimSpace(key) != key:
		// Keys compare exactly: "123 " would silently differ from "123".
		return f, &fieldError{"key", "The key starts or ends with spaces; remove them (keys are compared exactly)."}
	case strings.IndexFunc(key, unicode.IsControl) >= 0:
		return f, &fieldError{"key", "The key contains control characters."}
	}
	if copies != "" {
		n, err := strconv.Atoi(strings.TrimSpace(copies))
		if err != nil || n < 1 || n > maxCopies {
			return f, &fieldError{"copies", fmt.Sprintf("Copies must be a whole number from 1 to %d.", maxCopies)}
		}
		f.copies = n
	}
	return f, nil
}

// publish acts out the tutorial's form, and a publisher's retries: copies
// are the same message and key published again, each getting a new
// message ID from Pub/Sub, as a retried Publish whose response was lost.
func (c *Console) publish(w http.ResponseWriter, r *http.Request) {
	f, ferr := validate(r.PostForm.Get("message"), r.PostForm.Get("key"), r.PostForm.Get("copies"))
	if ferr != nil {
		writeErr(w, http.StatusBadRequest, ferr.field, ferr.msg)
		return
	}
	// Millisecond precision, as the attribute carries it; taken before the
	// first copy, so seeking to it replays this submission.
	at := time.UnixMilli(c.now().UnixMilli())
	attrs := map[string]string{c.o.EventTimeAttribute: strconv.FormatInt(at.UnixMilli(), 10)}
	if f.key != "" {
		attrs[c.o.IDAttribute] = f.key
	}
	s := c.subs.begin(at, f.key)
	ids := make([]string, 0, f.copies)
	defer func() { c.subs.finish(s, ids) }()
	for range f.copies {
		// One at a time, each confirmed before the next, as a retry
		// follows a failed attempt.
		res := c.pub.Publish(r.Context(), &pubsub.Message{Data: []byte(f.message), Attributes: attrs})
		id, err := res.Get(r.Context())
		if err != nil {
			c.log.Warn("console: publish", "topic", c.o.InputTopic.String(), "err", err)
			writeErr(w, http.StatusBadGateway, "", fmt.Sprintf("publish to %s failed after %d of %d copies: %v", c.o.InputTopic.ID, len(ids), f.copies, err))
			return
		}
		ids = append(ids, id)
	}
	c.log.Info("console: published", "topic", c.o.InputTopic.String(), "key", f.key, "message_ids", ids)
	writeJSON(w, http.StatusOK, map[string]any{"submission": s.id, "message_ids": ids, "key": f.key})
}

// redeliver acts out a redelivery through Pub/Sub itself: it seeks the
// pipeline's subscription (which retains acknowledged messages) back to
// just before a submission, so the server delivers its messages — and any
// published after them — again with their original message IDs. The
// pipeline sees IDs it already handled; it emits nothing.
func (c *Console) redeliver(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseUint(r.PostForm.Get("submission"), 10, 64)
	if err != nil {
		writeErr(w, http.StatusBadRequest, "", "no message chosen to redeliver")
		return
	}
	s := c.subs.get(id)
	if s == nil {
		writeErr(w, http.StatusNotFound, "", "that message is no longer remembered by the console; publish a new one")
		return
	}
	select { // a submission still publishing: its message IDs are not all known yet
	case <-s.done:
	case <-r.Context().Done():
		return
	}
	_, err = c.o.Client.SubscriptionAdminClient.Seek(r.Context(), &pubsubpb.SeekRequest{
		Subscription: c.o.PipelineSubscription.String(),
		Target:       &pubsubpb.SeekRequest_Time{Time: timestamppb.New(s.at)},
	})
	if err != nil {
		c.log.Warn("console: seek", "subscription", c.o.PipelineSubscription.String(), "err", err)
		writeErr(w, http.StatusBadGateway, "", fmt.Sprintf("seek %s failed: %v", c.o.PipelineSubscription.ID, err))
		return
	}
	n := c.subs.after(s.at)
	c.log.Info("console: redelivery", "subscription", c.o.PipelineSubscription.String(), "to", s.at, "message_ids", s.ids)
	writeJSON(w, http.StatusOK, map[string]any{
		"sought_to":   s.at.UTC().Format(time.RFC3339Nano),
		"message_ids": s.ids,
		"replayed":    n,
	})
}

// events streams the live view as server-sent events: a "row" event per
// output (resuming after Last-Event-ID on reconnect) and a "counts" event
// whenever the pipeline's counters change. It ends when the client leaves
// or the console stops.
func (c *Console) events(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	var last uint64
	// Event IDs are instance.seq: a page that reconnects to a restarted
	// console (new rows, new token) is told to reload instead of resuming
	// at a sequence number that now means something else.
	if v := r.Header.Get("Last-Event-ID"); v != "" {
		inst, seq, _ := strings.Cut(v, ".")
		n, err := strconv.ParseUint(seq, 10, 64)
		if inst != c.instance || err != nil {
			fmt.Fprint(w, "event: reset\ndata: {}\n\n")
			_ = rc.Flush()
			return
		}
		last = n
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	// A comment now and then shows a dead connection to both ends.
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	var sentCounts []byte
	for {
		rows, changed := c.feed.since(last)
		for _, row := range rows {
			b, _ := json.Marshal(row)
			if _, err := fmt.Fprintf(w, "id: %s.%d\nevent: row\ndata: %s\n\n", c.instance, row.Seq, b); err != nil {
				return
			}
			last = row.Seq
		}
		if b, _ := json.Marshal(countsView(c.o.Counts(), c.advice())); string(b) != string(sentCounts) {
			if _, err := fmt.Fprintf(w, "event: counts\ndata: %s\n\n", b); err != nil {
				return
			}
			sentCounts = b
		}
		if err := rc.Flush(); err != nil {
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-c.closing:
			return
		case <-changed:
		case <-tick.C:
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, code int, field, msg string) {
	writeJSON(w, code, map[string]string{"error": msg, "field": field})
}
