package redis

import (
	"context"
	"errors"
	"fmt"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
)

// errFewReplicas is a commit the master holds but fewer replicas than
// Options.Wait confirmed in time: the caller retries (the SET is an
// overwrite, safe to send again), as the gate does within half a lease.
var errFewReplicas = errors.New("fewer replicas than wait= confirmed the commit")

// commitWait sends commits with WAIT: each group of SETs and the WAIT
// after them go down one connection to the master that owns their keys,
// because WAIT counts the replicas that have every write sent on the
// connection it arrives on. A plain client's pipeline is one connection.
// A ClusterClient's pipeline is not: it splits by node using each
// command's first key, and WAIT has none, so go-redis would send it to any
// node. On a cluster the commits are therefore grouped by
// ClusterClient.MasterForKey and each group is a pipeline of that node's
// own *Client, which follows no redirect: a node that answers MOVED (its
// slots went to a promoted replica) or does not answer makes the client
// reload the slot map, and the commits fail as unavailable, to be retried
// on the new master.
func (b *batcher) commitWait(ctx context.Context, ops []*op) {
	cc, ok := b.rdb.(*goredis.ClusterClient)
	if !ok {
		b.waitGroup(ctx, b.rdb, ops, nil)
		return
	}
	groups := map[*goredis.Client][]*op{}
	for _, o := range ops {
		node, err := cc.MasterForKey(ctx, o.key)
		if err != nil {
			o.finish(b.classify(err))
			continue
		}
		groups[node] = append(groups[node], o)
	}
	var wg sync.WaitGroup
	for node, ops := range groups {
		wg.Go(func() { b.waitGroup(ctx, node, ops, cc) })
	}
	wg.Wait()
}

// waitGroup sends ops' SETs and one WAIT as one pipeline of c and answers
// each op. cc, when not nil, is the cluster client c belongs to.
func (b *batcher) waitGroup(ctx context.Context, c goredis.Cmdable, ops []*op, cc *goredis.ClusterClient) {
	pipe := c.Pipeline()
	cmds := make([]*goredis.Cmd, len(ops))
	for i, o := range ops {
		cmds[i] = pipe.Do(ctx, o.commitArgs()...)
	}
	// The WAIT timeout leaves half the round trip's budget to the SETs.
	wait := pipe.Do(ctx, "wait", b.wait, (b.timeout / 2).Milliseconds())
	_, perr := pipe.Exec(ctx)
	if perr != nil && cc != nil && !isReply(perr) {
		cc.ReloadState(ctx) // the node may be dead: learn who took its slots
	}
	n, werr := wait.Int64()
	for i, o := range ops {
		switch err := replyErr(cmds[i], perr); {
		case err != nil:
			o.finish(b.classify(err))
		case werr != nil:
			o.finish(b.classify(werr))
		case n < int64(b.wait):
			o.finish(fmt.Errorf("%w: %w (%d of %d)", dedup.ErrUnavailable, errFewReplicas, n, b.wait))
		default:
			o.finish(nil)
		}
	}
}

// isReply reports whether err is a reply from the server rather than a
// failure to reach it.
func isReply(err error) bool {
	var re goredis.Error
	return errors.As(err, &re)
}
