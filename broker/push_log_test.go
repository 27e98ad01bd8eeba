package broker

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestPushFailureLogged: an endpoint that starts failing shows once at
// the default log level, with the endpoint and why, and its recovery once
// more; the failed attempts in between stay at debug.
func TestPushFailureLogged(t *testing.T) {
	var logs testenv.Buffer
	tg := startOurs(t, Options{Now: time.Now, Logger: slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))})
	c := newClient(t, tg.addr)
	e := newEndpoint(t, func(n int, _ pushed) int {
		if n <= 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	topic := createTopic(t, c)
	pushSub(t, tg, c, &pb.Subscription{Topic: topic, PushConfig: &pb.PushConfig{PushEndpoint: e.URL},
		RetryPolicy: &pb.RetryPolicy{MinimumBackoff: durationpb.New(100 * time.Millisecond), MaximumBackoff: durationpb.New(100 * time.Millisecond)}})
	publishPB(t, c, topic, &pb.PubsubMessage{Data: []byte("one")})
	for range 4 {
		e.next(t, 30*time.Second)
	}
	var warn, info []map[string]any
	for deadline := time.Now().Add(10 * time.Second); len(info) == 0 && time.Now().Before(deadline); {
		warn, info = nil, nil
		for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) != nil {
				continue
			}
			switch rec["msg"] {
			case "push endpoint failing: messages are nacked and pushed again with backoff":
				warn = append(warn, rec)
			case "push endpoint answers again":
				info = append(info, rec)
			}
		}
		time.Sleep(20 * time.Millisecond) // the worker logs after the endpoint answered
	}
	if len(warn) != 1 || warn[0]["level"] != "WARN" || warn[0]["endpoint"] != e.URL || warn[0]["status"] != float64(503) {
		t.Errorf("warnings for 3 failed pushes: %v, want one naming the endpoint and status 503", warn)
	}
	if len(info) != 1 || info[0]["endpoint"] != e.URL {
		t.Errorf("recovery records: %v, want one naming the endpoint", info)
	}
}
