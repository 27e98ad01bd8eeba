package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptrace"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/limits"
)

// Push delivery, as the service documents it: each message is one POST to
// the subscription's endpoint; 102, 200, 201, 202 and 204 acknowledge it,
// anything else (or no answer within the ack deadline) is a nack.
const (
	// A nacked push message waits 100 ms, doubling per failed attempt up
	// to 60 s, unless the subscription has a retry policy.
	pushMinBackoff = 100 * time.Millisecond
	pushMaxBackoff = 60 * time.Second
	// The push window (messages outstanding at the endpoint) starts small,
	// grows by one per success (doubling per window's worth, as TCP's
	// slow start) and halves on a failure, within [1, pushMaxWindow].
	pushStartWindow = 3
	pushMaxWindow   = 3000
	pushUserAgent   = "CloudPubSub-Google"
	// pushDrain bounds how much of a response body is read so that the
	// connection can be reused.
	pushDrain = 64 << 10
)

// Headers written with write_metadata, the service's x-goog-pubsub-<KEY>
// for each piece of metadata (the delivery attempt only with a dead-letter
// policy, as in the wrapped body). Attributes never replace them.
const (
	hdrSubscription = "x-goog-pubsub-subscription-name"
	hdrMessageID    = "x-goog-pubsub-message-id"
	hdrPublishTime  = "x-goog-pubsub-publish-time"
	hdrOrderingKey  = "x-goog-pubsub-ordering-key"
	hdrAttempt      = "x-goog-pubsub-delivery-attempt"
	hdrPrefix       = "x-goog-pubsub-"
)

// pushTimeFormat is the publish time as the service writes it in a push:
// UTC with milliseconds.
const pushTimeFormat = "2006-01-02T15:04:05.000Z"

func (s *subscription) push() bool { return s.proto.PushConfig.GetPushEndpoint() != "" }

// checkPushConfig validates a push config; an empty endpoint means pull.
func checkPushConfig(pc *pb.PushConfig) error {
	ep := pc.GetPushEndpoint()
	if ep == "" {
		return nil
	}
	u, err := url.Parse(ep)
	valid := err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Hostname() != "" && u.User == nil
	if valid && u.Port() != "" {
		n, err := strconv.Atoi(u.Port())
		valid = err == nil && n > 0 && n <= 65535
	}
	if !valid {
		return status.Errorf(codes.InvalidArgument, "invalid push_endpoint %q: want an absolute http or https URL", redact.URL(ep))
	}
	if o := pc.GetOidcToken(); o != nil && o.ServiceAccountEmail == "" {
		return status.Error(codes.InvalidArgument, "push_config.oidc_token.service_account_email is required: it is the token's email claim")
	}
	return nil
}

// pusher delivers one push subscription. Its goroutine leases what the
// window allows and hands each message (each ordering key's batch, on an
// ordered subscription) to a worker goroutine of its own, which makes the
// request and settles the lease. A slow endpoint therefore only fills its
// own window; other subscriptions, pull or push, are not held back.
type pusher struct {
	b       *Broker
	s       *subscription
	wake    chan struct{}
	results chan pushResult // one per leased message; never fuller than the window
	workers sync.WaitGroup

	// Owned by the pusher's goroutine.
	window   int
	inFlight int

	// failing is set by a failed push and cleared by an acked one, so the
	// change is logged once each way, not every message.
	failing atomic.Bool

	tokMu  sync.Mutex // the OIDC token, reused until close to its expiry
	tok    string
	tokFor string
	tokExp time.Time
}

type pushResult int8

const (
	pushAcked   pushResult = iota
	pushFailed             // the endpoint nacked, failed or timed out
	pushSkipped            // not sent: an earlier message of its ordering key failed
)

// pushJob is one leased message on its way to the endpoint. Its lease's
// deadline, and the request's, run from when its request starts (begin):
// on an ordered subscription it may first wait for the messages of its key
// before it.
type pushJob struct {
	d        delivery
	deadline time.Duration
	ctx      context.Context
	cancel   context.CancelFunc
}

// pushTarget is what a request needs from the subscription, read under b.mu.
type pushTarget struct {
	endpoint string
	sub      string
	raw      bool // no_wrapper
	metadata bool // no_wrapper.write_metadata
	oidc     *pb.PushConfig_OidcToken
	ts       *transforms // the subscription's message_transforms
}

// startPusherLocked starts delivering s if it is a push subscription
// without a pusher. Pushers stop by themselves once their subscription is
// deleted or switched to pull, and with the broker.
func (b *Broker) startPusherLocked(s *subscription) {
	if b.replaying || s.pusher != nil || s.deleted() || !s.push() {
		return
	}
	select {
	case <-b.closing:
		return
	default:
	}
	p := &pusher{b: b, s: s, wake: make(chan struct{}, 1), results: make(chan pushResult, pushMaxWindow),
		window: pushStartWindow}
	s.pusher = p
	s.waiters[p.wake] = struct{}{}
	b.wg.Add(1)
	go p.run()
}

func (p *pusher) run() {
	b, s := p.b, p.s
	defer b.wg.Done()
	// Requests in flight when the subscription switches to pull finish
	// (within their ack deadline); at shutdown b.pushCtx ends them.
	defer p.workers.Wait()
	var ds []delivery
	for {
		b.mu.Lock()
		if !p.activeLocked() {
			delete(s.waiters, p.wake)
			if s.pusher == p {
				s.pusher = nil
			}
			b.mu.Unlock()
			return
		}
		var jobs []pushJob
		var tg pushTarget
		if room := p.window - p.inFlight; room > 0 {
			b.fireTimersLocked(b.nowNanos())
			deadline := time.Duration(s.proto.AckDeadlineSeconds) * time.Second
			ds = b.deliverLocked(s, room, limits.RequestBytes, deadline, nil, ds[:0])
			jobs = make([]pushJob, len(ds))
			for i, d := range ds {
				b.timers.remove(s.leases[d.ackID]) // until begin
				jobs[i] = pushJob{d: d, deadline: deadline}
			}
			clear(ds)
			p.inFlight += len(jobs)
			tg = targetOf(s)
		}
		ordered := s.ordered()
		b.mu.Unlock()
		p.dispatch(tg, jobs, ordered)

		select {
		case r := <-p.results:
			p.settle(r)
		case <-p.wake:
		case <-b.closing:
		}
		for drained := false; !drained; {
			select {
			case r := <-p.results:
				p.settle(r)
			default:
				drained = true
			}
		}
	}
}

// activeLocked reports whether the pusher still has work: the broker runs
// and the subscription exists and pushes.
func (p *pusher) activeLocked() bool {
	select {
	case <-p.b.closing:
		return false
	default:
	}
	return !p.s.deleted() && p.s.push() && p.s.pusher == p
}

// settle adjusts the window to a result: slow start on success,
// multiplicative decrease on failure.
func (p *pusher) settle(r pushResult) {
	p.inFlight--
	switch r {
	case pushAcked:
		p.window = min(p.window+1, pushMaxWindow)
	case pushFailed:
		p.window = max(p.window/2, 1)
	}
}

func targetOf(s *subscription) pushTarget {
	pc := s.proto.PushConfig
	nw := pc.GetNoWrapper()
	return pushTarget{endpoint: pc.PushEndpoint, sub: s.proto.Name, raw: nw != nil,
		metadata: nw.GetWriteMetadata(), oidc: pc.GetOidcToken(), ts: s.transforms}
}

// dispatch starts a worker per message, or per ordering key's batch on an
// ordered subscription (deliverLocked hands a key's batch out in one run),
// so that a key's messages reach the endpoint one at a time, in order.
func (p *pusher) dispatch(tg pushTarget, jobs []pushJob, ordered bool) {
	for len(jobs) > 0 {
		n := 1
		if key := jobs[0].d.m.key; ordered && key != "" {
			for n < len(jobs) && jobs[n].d.m.key == key {
				n++
			}
		}
		p.workers.Add(1)
		go p.work(tg, jobs[:n:n])
		jobs = jobs[n:]
	}
}

// work pushes jobs in order. After a failure the rest are not sent but
// given back, so that an ordering key's messages are redelivered in order.
func (p *pusher) work(tg pushTarget, jobs []pushJob) {
	defer p.workers.Done()
	failed := false
	for _, j := range jobs {
		r := pushSkipped
		if !failed && tg.ts != nil {
			switch p.b.transformDelivery(p.s, tg.ts, &j.d, true) {
			case transformFiltered:
				p.results <- pushAcked
				continue
			case transformFailed:
				p.results <- pushFailed
				failed = true
				continue
			}
		}
		if !failed && p.begin(&j) {
			r = pushFailed
			if p.send(j, tg) {
				r = pushAcked
			}
			j.cancel()
		}
		p.resolve(j, r)
		p.results <- r
		failed = failed || r != pushAcked
	}
}

// begin starts j's request: the lease's deadline runs from now, and ending
// the lease (its deadline, a seek, a delete) cancels the request. It
// reports false when the lease has ended already.
func (p *pusher) begin(j *pushJob) bool {
	b := p.b
	b.mu.Lock()
	defer b.mu.Unlock()
	l := p.s.leases[j.d.ackID]
	if l == nil || l.backoff {
		return false
	}
	j.ctx, j.cancel = context.WithTimeout(b.pushCtx, j.deadline)
	l.cancel = j.cancel
	l.at = b.nowNanos() + int64(j.deadline)
	b.timers.push(l)
	return true
}

// resolve acks or nacks the job's lease, unless it ended meanwhile (its
// deadline passed, or the subscription was deleted or reset by a seek).
func (p *pusher) resolve(j pushJob, r pushResult) {
	b, s := p.b, p.s
	b.mu.Lock()
	defer b.mu.Unlock()
	l := s.leases[j.d.ackID]
	if l == nil || l.backoff {
		return
	}
	switch {
	case r == pushAcked:
		b.ackLeaseLocked(l)
	case r == pushSkipped || b.pushCtx.Err() != nil:
		// Not sent, or interrupted by the shutdown: the message goes back
		// as it was, the attempt not counted against its dead-letter policy.
		b.endLeaseLocked(l)
		l.it.attempts--
		b.requeueLocked(s, l.it)
	default:
		b.nackLocked(l, b.nowNanos())
	}
}

// errAckedEarly ends a request whose endpoint answered 102 Processing,
// which the service counts as an ack.
var errAckedEarly = errors.New("endpoint answered 102 Processing")

// send makes one push request and reports whether the endpoint acked it.
func (p *pusher) send(j pushJob, tg pushTarget) bool {
	var processing atomic.Bool
	ctx := httptrace.WithClientTrace(j.ctx, &httptrace.ClientTrace{
		Got1xxResponse: func(code int, _ textproto.MIMEHeader) error {
			if code == http.StatusProcessing {
				processing.Store(true)
				return errAckedEarly
			}
			return nil
		},
	})
	req, err := p.request(ctx, j.d, tg)
	if err != nil {
		p.b.log.Warn("push request not built; the message is nacked", "subscription", tg.sub, "err", err)
		return false
	}
	resp, err := p.b.pushClient.Do(req)
	if err != nil {
		if processing.Load() {
			return p.answered(tg)
		}
		p.failed(tg, j, "err", err)
		return false
	}
	_, _ = io.CopyN(io.Discard, resp.Body, pushDrain)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusProcessing, http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent:
		return p.answered(tg)
	}
	p.failed(tg, j, "status", resp.StatusCode)
	return false
}

// failed logs a failed push: as a warning when the endpoint answered
// before it (an endpoint that is down must show at the default level),
// else at debug.
func (p *pusher) failed(tg pushTarget, j pushJob, why ...any) {
	args := append([]any{"subscription", tg.sub, "endpoint", tg.endpoint, "message_id", j.d.m.id()}, why...)
	if p.failing.CompareAndSwap(false, true) {
		p.b.log.Warn("push endpoint failing: messages are nacked and pushed again with backoff", args...)
		return
	}
	p.b.log.Debug("push failed", args...)
}

// answered notes an acked push, and logs the endpoint's recovery.
func (p *pusher) answered(tg pushTarget) bool {
	if p.failing.CompareAndSwap(true, false) {
		p.b.log.Info("push endpoint answers again", "subscription", tg.sub, "endpoint", tg.endpoint)
	}
	return true
}

// request builds the POST for one message: the wrapped JSON body by
// default; with no_wrapper the data itself, and with write_metadata the
// metadata in x-goog-pubsub-* headers and the attributes as headers.
func (p *pusher) request(ctx context.Context, d delivery, tg pushTarget) (*http.Request, error) {
	m := d.m
	publish := time.Unix(0, m.publish).UTC().Format(pushTimeFormat)
	var body []byte
	if tg.raw {
		body = m.data()
	} else {
		var err error
		if body, err = wrappedBody(d, tg.sub, publish); err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, tg.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	h := req.Header
	h.Set("User-Agent", pushUserAgent)
	if !tg.raw {
		h.Set("Content-Type", "application/json")
	}
	if tg.oidc != nil {
		tok, err := p.token(tg.oidc, tg.endpoint)
		if err != nil {
			return nil, err
		}
		h.Set("Authorization", "Bearer "+tok)
	}
	if tg.metadata {
		for k, v := range m.attrs() {
			if attributeHeader(k, v) && h.Get(k) == "" {
				h.Set(k, v)
			}
		}
		h.Set(hdrSubscription, tg.sub)
		h.Set(hdrMessageID, m.id())
		h.Set(hdrPublishTime, publish)
		if m.key != "" {
			h.Set(hdrOrderingKey, m.key)
		}
		if d.attempt > 0 {
			h.Set(hdrAttempt, strconv.Itoa(int(d.attempt)))
		}
	}
	return req, nil
}

// attributeHeader reports whether an attribute may travel as a header: a
// valid header field, not one that HTTP itself or the push metadata owns.
func attributeHeader(k, v string) bool {
	if !httpguts.ValidHeaderFieldName(k) || !httpguts.ValidHeaderFieldValue(v) {
		return false
	}
	switch textproto.CanonicalMIMEHeaderKey(k) {
	case "Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive", "Te", "Trailer", "Upgrade",
		"Proxy-Authorization", "Proxy-Connection":
		return false
	}
	return !strings.HasPrefix(strings.ToLower(k), hdrPrefix)
}

// pushBody is the wrapped request body; the fields are in the order of
// the service's documentation, which writes the message ID and publish
// time twice, in both spellings.
type pushBody struct {
	DeliveryAttempt int32       `json:"deliveryAttempt,omitempty"`
	Message         pushMessage `json:"message"`
	Subscription    string      `json:"subscription"`
}

type pushMessage struct {
	Attributes   map[string]string `json:"attributes,omitempty"`
	Data         []byte            `json:"data,omitempty"`
	MessageID    string            `json:"messageId"`
	MessageIDOld string            `json:"message_id"`
	OrderingKey  string            `json:"orderingKey,omitempty"`
	PublishTime  string            `json:"publishTime"`
	PublishOld   string            `json:"publish_time"`
}

func wrappedBody(d delivery, sub, publish string) ([]byte, error) {
	id := d.m.id()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // JSON needs no escapes for <, > and &; Go adds them for HTML
	err := enc.Encode(pushBody{
		DeliveryAttempt: d.attempt,
		Message: pushMessage{Attributes: d.m.attrs(), Data: d.m.data(), MessageID: id, MessageIDOld: id,
			OrderingKey: d.m.key, PublishTime: publish, PublishOld: publish},
		Subscription: sub,
	})
	if err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// newPushClient is the HTTP client of every push: its own transport, no
// redirects followed (a 3xx is a nack, as with the service).
func newPushClient() *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConns = 0
	t.MaxIdleConnsPerHost = pushMaxWindow
	return &http.Client{
		Transport:     t,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
