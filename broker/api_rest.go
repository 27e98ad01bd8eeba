package broker

import (
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/dedupflow/dedupflow/broker/internal/transcode"
	"github.com/dedupflow/dedupflow/internal/localguard"
)

// restHandler serves the REST API: package transcode translates it to the
// services the gRPC server registers (see services); the broker adds the
// transform calls that have no gRPC method, the push endpoints' keys, and
// the guards that keep web pages out of it.
func (b *Broker) restHandler(services []transcode.Service) (http.Handler, error) {
	h, err := transcode.NewHandler(services, b.serveTransformCall)
	if err != nil {
		return nil, err
	}
	deny := func(w http.ResponseWriter, _ *http.Request, code int, msg string) {
		transcode.WriteError(w, code, codes.PermissionDenied, msg)
	}
	return transcode.KeepSemicolons(localguard.Host(b.opts.AllowedHosts, deny, localguard.SameSite(false, deny, b.withPushKeys(h)))), nil
}
