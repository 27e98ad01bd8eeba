package consumer

import (
	"context"
	"fmt"
	"net/http"

	"cloud.google.com/go/pubsub/v2"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/push"
)

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
// without calling next; a copy whose original is being handled by another
// replica right now answers 429, so Pub/Sub backs off and retries (one
// being handled in this process waits for it, up to the lease); a store
// outage answers 503; a body that is not a push request answers 400 and
// is counted in dedupflow_push_malformed_total. Options.VerifyToken, if
// set, checks the request's bearer token first (401 without a good one);
// without it nothing is verified. A request a browser marks as from another
// site is refused with 403 in any case.
func PushHandler(store dedup.Store, opt Options, next http.Handler) (http.Handler, error) {
	if next == nil {
		return nil, invalid("nil next handler")
	}
	reg := opt.Registerer
	opt.Registerer = nil // registered below, with the push counter
	var d *Dedup
	d, err := New(store, opt, func(ctx context.Context, m *pubsub.Message) error {
		return push.Serve(ctx, m, next, d.opt.Logger)
	})
	if err != nil {
		return nil, err
	}
	s := &push.Server{Pass: d.gate.Pass, Stopped: d.gate.Err, Verify: opt.VerifyToken, Logger: d.opt.Logger,
		Attributes: []string{opt.IDAttribute, opt.ProducerAttribute, opt.TimestampAttribute}, Malformed: push.NewMalformed()}
	if reg != nil {
		if err := reg.Register(d.gate.Collector()); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
		if err := reg.Register(s.Malformed); err != nil {
			return nil, fmt.Errorf("register metrics: %w", err)
		}
	}
	return s.Handler(), nil
}

// MessageFrom returns the message a push handler's next is called for
// (a copy whose Ack and Nack do nothing: the answer decides).
func MessageFrom(ctx context.Context) (*pubsub.Message, bool) { return push.Message(ctx) }
