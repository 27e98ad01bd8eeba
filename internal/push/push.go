// Package push serves a Pub/Sub push subscription's endpoint for a front
// end that runs messages through the gate: it decodes each push request
// (the wrapped JSON body, or an unwrapped one with write_metadata
// headers), passes the message, and answers with the status Pub/Sub reads
// as an ack (2xx) or a nack (anything else).
package push

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/internal/localguard"
	"github.com/dedupflow/dedupflow/limits"
	"github.com/dedupflow/dedupflow/outcome"
)

// maxBody bounds a push request's body: a 10 MB message, base64 encoded,
// wrapped in JSON with its attributes.
const maxBody = limits.MessageBytes*4/3 + 1<<20

// Server is the endpoint.
type Server struct {
	// Pass runs one message; its outcome becomes the answer, given after
	// its nack delay for a nack: Pub/Sub's push backoff starts after it.
	Pass func(ctx context.Context, m *pubsub.Message) outcome.Result
	// Stopped is the error that stopped the front end for good, or nil.
	Stopped func() error
	// Verify, if set, checks the request's bearer token; an error answers
	// 401. Nil verifies nothing.
	Verify func(ctx context.Context, token string) error
	// Attributes are the attribute names the front end reads (the id,
	// producer and timestamp attributes): an unwrapped request carries
	// attributes as headers, whose names lose their case, so these are
	// looked up by name.
	Attributes []string
	Logger     *slog.Logger
	// Malformed counts bodies that are not push requests.
	Malformed prometheus.Counter
}

// NewMalformed is the counter of bodies that were not push requests.
func NewMalformed() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupflow_push_malformed_total",
		Help: "Push requests whose body was not a Pub/Sub push request (answered 400)."})
}

// Handler is s behind a refusal (403) of requests a browser marks as from
// another site: Pub/Sub sends neither Origin nor Sec-Fetch-Site, and any
// page the user opens could otherwise post messages to an endpoint on
// this machine or network, even one that verifies tokens.
func (s *Server) Handler() http.Handler {
	return localguard.SameSite(false, func(w http.ResponseWriter, _ *http.Request, code int, msg string) {
		http.Error(w, msg, code)
	}, s)
}

// answers maps an outcome to the status Pub/Sub reads as ack or nack.
var answers = map[outcome.Outcome]int{
	outcome.Emitted:             http.StatusNoContent,
	outcome.DuplicateRedelivery: http.StatusNoContent,
	outcome.DuplicateRepublish:  http.StatusNoContent,
	outcome.DeadLettered:        http.StatusNoContent,
	outcome.InFlightConflict:    http.StatusTooManyRequests,
}

type exchangeCtx struct{}

// exchange is one request on its way through the gate.
type exchange struct {
	r   *http.Request
	rec *recorder // the work's own answer (Serve), held until the key is committed
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "push requests are POSTs", http.StatusMethodNotAllowed)
		return
	}
	if s.Verify != nil {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "missing bearer token", http.StatusUnauthorized)
			return
		}
		if err := s.Verify(r.Context(), token); err != nil {
			http.Error(w, "token refused: "+err.Error(), http.StatusUnauthorized)
			return
		}
	}
	m, err := decode(r, s.Attributes)
	if err != nil {
		if s.Malformed != nil {
			s.Malformed.Inc()
		}
		http.Error(w, "not a Pub/Sub push request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ex := &exchange{r: r}
	res := s.Pass(context.WithValue(r.Context(), exchangeCtx{}, ex), m)
	o := res.Outcome
	if !o.Acked() {
		res.Settle(r.Context(), noDelivery{}) // holds the answer for the nack delay
	}
	switch {
	case ex.rec != nil && (o == outcome.Emitted || o == outcome.Retried):
		ex.rec.replay(w) // the work's own answer, 2xx or not
	case answers[o] != 0:
		w.WriteHeader(answers[o])
	case s.Stopped != nil && s.Stopped() != nil:
		http.Error(w, "dedup stopped: "+s.Stopped().Error(), http.StatusServiceUnavailable)
	default: // a dependency is down, or an unusable message with nowhere to go
		http.Error(w, "not handled now; retry later", http.StatusServiceUnavailable)
	}
}

// noDelivery is the pushed message as Settle sees it: the answer, not an
// ack or a nack call, settles a push.
type noDelivery struct{}

func (noDelivery) Ack()  {}
func (noDelivery) Nack() {}

type msgCtx struct{}

// Serve runs next for m as a gate's work, from within Server.Pass: next's
// answer is recorded and sent once the gate has settled the key; a
// non-2xx answer or a panic (answered 500) is a failure, so the key is
// released.
func Serve(ctx context.Context, m *pubsub.Message, next http.Handler, log *slog.Logger) (err error) {
	ex, ok := ctx.Value(exchangeCtx{}).(*exchange)
	if !ok {
		return errors.New("push.Serve outside a push request")
	}
	ex.rec = &recorder{header: http.Header{}}
	defer func() {
		if p := recover(); p != nil {
			log.Error("push handler panicked: key released, answering 500", "message_id", m.ID, "panic", p)
			ex.rec = &recorder{header: http.Header{}, status: http.StatusInternalServerError}
			err = fmt.Errorf("push handler panicked: %v", p)
		}
	}()
	next.ServeHTTP(ex.rec, ex.r.WithContext(context.WithValue(ctx, msgCtx{}, m)))
	if s := ex.rec.code(); s < 200 || s > 299 {
		return fmt.Errorf("push handler answered %d", s)
	}
	return nil
}

// Message returns the message Serve runs next for.
func Message(ctx context.Context) (*pubsub.Message, bool) {
	m, ok := ctx.Value(msgCtx{}).(*pubsub.Message)
	return m, ok
}

// recorder holds the work's answer until the key is committed.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func (r *recorder) code() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

func (r *recorder) replay(w http.ResponseWriter) {
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.code())
	_, _ = w.Write(r.body.Bytes())
}

// request is the wrapped body of a push request.
type request struct {
	Message *struct {
		Data        []byte            `json:"data"` // base64, as encoding/json decodes []byte
		Attributes  map[string]string `json:"attributes"`
		MessageID   string            `json:"messageId"`
		MessageID2  string            `json:"message_id"`
		PublishTime time.Time         `json:"publishTime"`
		OrderingKey string            `json:"orderingKey"`
	} `json:"message"`
	Subscription    string `json:"subscription"`
	DeliveryAttempt *int   `json:"deliveryAttempt"`
}

// Headers of an unwrapped push request with write_metadata.
const (
	hdrPrefix      = "X-Goog-Pubsub-"
	hdrMessageID   = hdrPrefix + "Message-Id"
	hdrPublishTime = hdrPrefix + "Publish-Time"
	hdrOrderingKey = hdrPrefix + "Ordering-Key"
	hdrAttempt     = hdrPrefix + "Delivery-Attempt"
)

// decode reads the message of a push request.
func decode(r *http.Request, attrs []string) (*pubsub.Message, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if id := r.Header.Get(hdrMessageID); id != "" {
		return unwrapped(r, body, id, attrs)
	}
	var req request
	if err := json.Unmarshal(body, &req); err != nil {
		var b64 base64.CorruptInputError
		if errors.As(err, &b64) {
			return nil, fmt.Errorf("message.data is not base64: %w", err)
		}
		return nil, fmt.Errorf("body is not the JSON of a push request (an unwrapped push needs write_metadata, for the message ID): %w", err)
	}
	pm := req.Message
	if pm == nil {
		return nil, errors.New(`no "message" in the body`)
	}
	id := pm.MessageID
	if id == "" {
		id = pm.MessageID2
	}
	if id == "" {
		return nil, errors.New("the message has no messageId")
	}
	return &pubsub.Message{ID: id, Data: pm.Data, Attributes: pm.Attributes, PublishTime: pm.PublishTime,
		OrderingKey: pm.OrderingKey, DeliveryAttempt: req.DeliveryAttempt}, nil
}

// unwrapped reads an unwrapped push request: the data is the body, the
// metadata x-goog-pubsub-* headers, the attributes other headers.
func unwrapped(r *http.Request, body []byte, id string, attrs []string) (*pubsub.Message, error) {
	m := &pubsub.Message{ID: id, Data: body, OrderingKey: r.Header.Get(hdrOrderingKey), Attributes: map[string]string{}}
	if s := r.Header.Get(hdrPublishTime); s != "" {
		t, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", hdrPublishTime, err)
		}
		m.PublishTime = t
	}
	if s := r.Header.Get(hdrAttempt); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", hdrAttempt, err)
		}
		m.DeliveryAttempt = &n
	}
	for _, name := range attrs {
		if v := r.Header.Get(name); name != "" && v != "" {
			m.Attributes[name] = v
		}
	}
	return m, nil
}
