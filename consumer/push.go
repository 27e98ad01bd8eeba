package consumer

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/outcome"
	"github.com/dedupflow/dedupflow/limits"
)

// maxPushBody bounds a push request's body: a 10 MB message, base64
// encoded, wrapped in JSON with its attributes.
const maxPushBody = limits.MessageBytes*4/3 + 1<<20

// PushHandler returns the endpoint of a push subscription: it decodes
// each push request (the wrapped JSON body, or an unwrapped one with
// write_metadata headers), runs the decision path Handler runs, and calls
// next for a message whose key was not handled within the horizon, with
// the message in the request's context (MessageFrom, KeyFromContext).
//
// Pub/Sub treats a 2xx answer as the ack. So the key is committed only
// when next answers 2xx, and only then is next's answer sent on; a
// non-2xx answer or a panic in next releases the key and answers non-2xx
// (a panic 500), so Pub/Sub redelivers. A caught duplicate answers 204
// without calling next; a copy whose original is being handled right now
// answers 429, so Pub/Sub backs off and retries; a store outage answers
// 503; a body that is not a push request answers 400 and is counted in
// dedupflow_push_malformed_total. Options.VerifyToken, if set, checks the
// request's bearer token first (401 without a good one); without it
// nothing is verified.
func PushHandler(store dedup.Store, opt Options, next http.Handler) (http.Handler, error) {
	if next == nil {
		return nil, invalid("nil next handler")
	}
	h := &pushHandler{next: next, verify: opt.VerifyToken,
		malformed: prometheus.NewCounter(prometheus.CounterOpts{Name: "dedupflow_push_malformed_total",
			Help: "Push requests whose body was not a Pub/Sub push request (answered 400)."})}
	reg := opt.Registerer
	opt.Registerer = nil // registered below, with the push counter
	d, err := New(store, opt, h.serve)
	if err != nil {
		return nil, err
	}
	h.d = d
	if reg != nil {
		if err := reg.Register(d.gate.Collector()); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
		if err := reg.Register(h.malformed); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return h, nil
}

type pushHandler struct {
	d         *Dedup
	next      http.Handler
	verify    func(ctx context.Context, token string) error
	malformed prometheus.Counter
}

// exchange is one push request on its way through the gate.
type exchange struct {
	w   http.ResponseWriter
	r   *http.Request
	rec *recorder // next's answer, held until the key is committed
}

type exchangeCtx struct{}

// pushStatus maps an outcome to the answer Pub/Sub reads as ack or nack.
var pushStatus = map[outcome.Outcome]int{
	outcome.DuplicateRedelivery: http.StatusNoContent,
	outcome.DuplicateRepublish:  http.StatusNoContent,
	outcome.DeadLettered:        http.StatusNoContent,
	outcome.InFlightConflict:    http.StatusTooManyRequests,
}

func (h *pushHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "push requests are POSTs", http.StatusMethodNotAllowed)
		return
	}
	if h.verify != nil {
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || token == "" {
			http.Error(w, "missing bearer token", http.StatusUnauthorized)
			return
		}
		if err := h.verify(r.Context(), token); err != nil {
			http.Error(w, "token refused: "+err.Error(), http.StatusUnauthorized)
			return
		}
	}
	m, err := decodePush(r, h.d.opt)
	if err != nil {
		h.malformed.Inc()
		http.Error(w, "not a Pub/Sub push request: "+err.Error(), http.StatusBadRequest)
		return
	}
	ex := &exchange{w: w, r: r}
	o := h.d.gate.Pass(context.WithValue(r.Context(), exchangeCtx{}, ex), m)
	switch {
	case ex.rec != nil && (o == outcome.Emitted || o == outcome.Retried):
		ex.rec.replay(w) // next's own answer, 2xx or not
	case pushStatus[o] != 0:
		w.WriteHeader(pushStatus[o])
	case h.d.gate.Err() != nil:
		http.Error(w, "dedup stopped: "+h.d.gate.Err().Error(), http.StatusServiceUnavailable)
	default: // the store is down, or an unusable message without OnReject
		http.Error(w, "not handled now; retry later", http.StatusServiceUnavailable)
	}
}

// serve is the gate's work: next, recorded. A non-2xx answer or a panic is
// a failure, so the key is released.
func (h *pushHandler) serve(ctx context.Context, m *pubsub.Message) (err error) {
	ex := ctx.Value(exchangeCtx{}).(*exchange)
	ctx = context.WithValue(ctx, pushMsgCtx{}, m)
	ex.rec = &recorder{header: http.Header{}}
	defer func() {
		if p := recover(); p != nil {
			h.d.opt.Logger.Error("push handler panicked: key released, answering 500", "panic", p)
			ex.rec = &recorder{header: http.Header{}, status: http.StatusInternalServerError}
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	h.next.ServeHTTP(ex.rec, ex.r.WithContext(ctx))
	if s := ex.rec.code(); s < 200 || s > 299 {
		return fmt.Errorf("handler answered %d", s)
	}
	return nil
}

// MessageFrom returns the message a push handler's next is called for
// (a copy whose Ack and Nack do nothing: the answer decides).
func MessageFrom(ctx context.Context) (*pubsub.Message, bool) {
	m, ok := ctx.Value(pushMsgCtx{}).(*pubsub.Message)
	return m, ok
}

type pushMsgCtx struct{}

// recorder holds next's answer until the key is committed.
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

// pushRequest is the wrapped body of a push request.
type pushRequest struct {
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

// decodePush reads the message of a push request.
func decodePush(r *http.Request, opt Options) (*pubsub.Message, error) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxPushBody))
	if err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	if id := r.Header.Get(hdrMessageID); id != "" {
		return unwrapped(r, body, id, opt)
	}
	var req pushRequest
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
	m := &pubsub.Message{ID: id, Data: pm.Data, Attributes: pm.Attributes, PublishTime: pm.PublishTime, OrderingKey: pm.OrderingKey}
	if req.DeliveryAttempt != nil {
		m.DeliveryAttempt = req.DeliveryAttempt
	}
	return m, nil
}

// unwrapped reads an unwrapped push request: the data is the body, the
// metadata x-goog-pubsub-* headers, the attributes other headers. Header
// names lose their case, so the attributes the options name are looked up
// by those names.
func unwrapped(r *http.Request, body []byte, id string, opt Options) (*pubsub.Message, error) {
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
	for _, name := range []string{opt.IDAttribute, opt.ProducerAttribute, opt.TimestampAttribute} {
		if v := r.Header.Get(name); name != "" && v != "" {
			m.Attributes[name] = v
		}
	}
	return m, nil
}
