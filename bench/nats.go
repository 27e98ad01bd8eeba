package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// measureNATS publishes the workload's events and copies to an embedded
// JetStream server with Nats-Msg-Id set to the key: the dedup NATS users
// reach for. Its dedup happens when a message is stored, so there is no
// consumer and no redelivery to inject; the stream must end up holding
// exactly one message per event, and exactly one publish per key must be
// acknowledged as not a duplicate.
func measureNATS(ctx context.Context, wl workload, dir string, timeout time.Duration) (pipeSample, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return pipeSample{}, fmt.Errorf("nats server: %w", err)
	}
	ns.Start()
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	if !ns.ReadyForConnections(10 * time.Second) {
		return pipeSample{}, errors.New("nats server not ready after 10s")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return pipeSample{}, fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return pipeSample{}, fmt.Errorf("jetstream: %w", err)
	}
	// The duplicate window is the same 10 minutes as the other contenders'
	// horizon; memory storage, like the in-memory broker and store.
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.events"},
		Storage: jetstream.MemoryStorage, Duplicates: 10 * time.Minute})
	if err != nil {
		return pipeSample{}, fmt.Errorf("create stream: %w", err)
	}
	msgs := wl.plan()
	futures := make([]jetstream.PubAckFuture, len(msgs))
	start := time.Now()
	for i, m := range msgs {
		msg := nats.NewMsg("bench.events")
		msg.Data = wl.data(m)
		f, err := js.PublishMsgAsync(msg, jetstream.WithMsgID(wl.key(m.event)), jetstream.WithStallWait(time.Minute))
		if err != nil {
			return pipeSample{}, fmt.Errorf("publish message %d: %w", i, err)
		}
		futures[i] = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
		return pipeSample{}, ctx.Err()
	case <-time.After(timeout):
		return pipeSample{}, &correctnessError{fmt.Sprintf("NATS: %d publishes not acknowledged after %v", js.PublishAsyncPending(), timeout)}
	}
	s := pipeSample{messagesIn: len(msgs), elapsed: time.Since(start)}
	s.rate = float64(s.messagesIn) / s.elapsed.Seconds()

	stored := make([]int, wl.events)
	for i, f := range futures {
		select {
		case a := <-f.Ok():
			if !a.Duplicate {
				stored[msgs[i].event]++
			}
		case err := <-f.Err():
			return s, fmt.Errorf("NATS: publish %d failed: %w", i, err)
		}
	}
	info, err := st.Info(ctx)
	if err != nil {
		return s, fmt.Errorf("stream info: %w", err)
	}
	var leaked, lost int
	for _, n := range stored {
		switch {
		case n == 0:
			lost++
		case n > 1:
			leaked++
		}
	}
	if leaked > 0 || lost > 0 || info.State.Msgs != uint64(wl.events) {
		return s, &correctnessError{fmt.Sprintf("NATS: %d keys stored more than once, %d not stored, stream holds %d messages for %d events",
			leaked, lost, info.State.Msgs, wl.events)}
	}
	s.emitted = int(info.State.Msgs)
	return s, nil
}
