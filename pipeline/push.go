package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/dedupflow/dedupflow/internal/push"
)

// PushOptions configure ServePush.
type PushOptions struct {
	// Path is where Pub/Sub posts; default "/".
	Path string
	// Verify, if set, checks each request's bearer token (an OIDC ID
	// token); an error answers 401. Nil verifies nothing.
	Verify func(ctx context.Context, token string) error
	// Drain bounds how long requests in flight may finish after ctx ends;
	// default the write timeout plus a second.
	Drain time.Duration
}

// ServePush receives pushes on ln instead of pulling: each POST is one
// message, run through the same path as Run's, and the answer is the ack
// (204 once the output is written and the key recorded, or for a caught
// duplicate) or a nack (429 for a copy in flight elsewhere, 503 while the
// sink or store is down, 400 for a body that is not a push request). With
// push, Pub/Sub paces redeliveries itself. It returns when ctx ends, after
// the requests in flight finish, or with the error that stopped the
// pipeline for good.
func (p *Pipeline) ServePush(ctx context.Context, ln net.Listener, o PushOptions) error {
	if o.Path == "" {
		o.Path = "/"
	}
	if o.Drain <= 0 {
		o.Drain = p.cfg.WriteTimeout + time.Second
	}
	s := &push.Server{Pass: p.gate.Pass, Stopped: p.gate.Err, Verify: o.Verify, Logger: p.log,
		Attributes: []string{p.cfg.IDAttribute, p.cfg.ProducerAttribute, p.cfg.TimestampAttribute},
		Malformed:  push.NewMalformed()}
	if p.reg != nil {
		if err := p.reg.Register(s.Malformed); err != nil {
			return fmt.Errorf("register metrics: %w", err)
		}
	}
	mux := http.NewServeMux()
	mux.Handle(o.Path, s.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := p.start(ctx)
	defer stop()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	select {
	case err := <-served:
		return fmt.Errorf("serve pushes: %w", err)
	case <-ctx.Done():
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.Drain)
	defer cancel()
	if err := srv.Shutdown(dctx); err != nil {
		p.log.Warn("push requests still in flight at the end of the drain were cut off; Pub/Sub redelivers them", "err", err)
	}
	if err := <-served; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve pushes: %w", err)
	}
	return p.gate.Err()
}
