package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
)

// errFewReplicas is a write (a claim, a commit or a sliding extension) the
// master holds but fewer replicas than Options.Wait confirmed in time: the
// caller retries (a commit's SET is an overwrite, a claim of one's own is
// taken again, an extension is moved again), as the gate does.
var errFewReplicas = errors.New("fewer replicas than wait= confirmed the write")

// sendWait sends batch with WAIT: each group of writes and the WAIT after
// them go down one connection to the master that owns their keys, because
// WAIT counts the replicas that have every write sent on the connection it
// arrives on. A plain client's pipeline is one connection. A
// ClusterClient's pipeline is not: it splits by node using each command's
// first key, and WAIT has none, so go-redis would send it to any node. On
// a cluster the batch is therefore grouped by ClusterClient.MasterForKey
// and each group is a pipeline of that node's own *Client, which follows
// no redirect: a node that answers MOVED (its slots went to a promoted
// replica) or does not answer makes the client reload the slot map, and
// the ops fail as unavailable, to be retried on the new master.
//
// Claims are confirmed as well as commits: a claim only the dead master
// held would let a copy through on its heir while the first is written.
func (b *batcher) sendWait(ctx context.Context, batch []*op) {
	cc, ok := b.rdb.(*goredis.ClusterClient)
	if !ok {
		b.send(ctx, b.rdb, batch, nil)
		return
	}
	groups := map[*goredis.Client][]*op{}
	for _, o := range batch {
		node, err := cc.MasterForKey(ctx, o.key)
		if err != nil {
			o.finish(b.classify(err))
			continue
		}
		groups[node] = append(groups[node], o)
	}
	var wg sync.WaitGroup
	for node, ops := range groups {
		wg.Go(func() { b.send(ctx, node, ops, cc) })
	}
	wg.Wait()
}

// waitCmd queues WAIT on pipe when Options.Wait asks for it; nil if not.
// Its timeout leaves half the round trip's budget to the writes.
func (b *batcher) waitCmd(ctx context.Context, pipe goredis.Pipeliner) *goredis.Cmd {
	if b.wait == 0 {
		return nil
	}
	return pipe.Do(ctx, "wait", b.wait, (b.timeout / 2).Milliseconds())
}

// replicated is nil when wait (from waitCmd) confirmed enough replicas or
// there was no wait, and otherwise the error of the writes before it.
func (b *batcher) replicated(wait *goredis.Cmd, perr error) error {
	if wait == nil {
		return nil
	}
	n, err := wait.Int64()
	if err != nil {
		return b.classify(replyErr(wait, perr))
	}
	if n < int64(b.wait) {
		return fmt.Errorf("%w: %w (%d of %d)", dedup.ErrUnavailable, errFewReplicas, n, b.wait)
	}
	return nil
}

// lost reloads the cluster's slot map when a node did not answer (it may
// be dead): the retry then goes to whoever took its slots.
func (b *batcher) lost(cc *goredis.ClusterClient, perr error) {
	if cc != nil && perr != nil && !isReply(perr) {
		cc.ReloadState(b.ctx)
	}
}

// isReply reports whether err is a reply from the server rather than a
// failure to reach it.
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}
