package redis

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/redisconn"
)

// Claim script, for the claims that must overwrite a record (see the
// package doc). It decides again on the server, atomically: the record may
// have changed since SET NX GET read it. Its decision is dedup.Judge's,
// written in Lua: keep the two alike.
// KEYS[1] key; ARGV: message ID, message tag, now ms, lease-until ms, TTL ms.
// Returns 1 proceed, 2 duplicate (redelivery), 3 duplicate (republish),
// 4 in flight.
var claimScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v then
  local c = string.find(v, ':', 2, true)
  if c then
    local at = tonumber(string.sub(v, 2, c - 1))
    local rest = string.sub(v, c + 1)
    local now = tonumber(ARGV[3])
    local t = string.sub(v, 1, 1)
    if t == 'd' and now < at then
      if rest == ARGV[2] then return 2 end
      return 3
    end
    if t == 'p' and now < at then return 4 end
  end
end
redis.call('SET', KEYS[1], 'p' .. ARGV[4] .. ':' .. ARGV[1], 'PX', ARGV[5])
return 1
`)

// Release script: delete the record only while it is a claim of this
// message. KEYS[1] key; ARGV[1] message ID.
var releaseScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, 1) == 'p' then
  local c = string.find(v, ':', 2, true)
  if c and string.sub(v, c + 1) == ARGV[1] then
    redis.call('DEL', KEYS[1])
    return 1
  end
end
return 0
`)

const (
	opClaim uint8 = iota + 1
	opCommit
	opRelease
	opExtend // the sliding horizon's new expiry for a duplicate's key
)

// op is one queued call. Ops are pooled, and a SET's arguments point into
// its op (*string and *int64 go into an interface without allocating; a
// go-redis hook that prints commands shows their addresses), so a claim
// allocates its key-and-value string and its go-redis Cmd, no more: at
// this rate, garbage collection is a cost of its own.
type op struct {
	kind  uint8
	key   string // prefix + hex(dedup key)
	val   string // what SET writes (claim, commit); shares key's allocation
	msgID string
	now   int64 // ms
	at    int64 // lease-until or expiry, ms
	ttl   int64 // ms, for Redis to drop the key
	args  [7]any

	verdict dedup.Verdict
	err     error
	done    chan struct{} // cap 1, so an op can be answered again once recycled
}

func (o *op) finish(err error) {
	o.err = err
	o.done <- struct{}{} // never blocks: one answer per use, cap 1
}

// tag is the message's tag, for the rare claim that meets a record.
func (o *op) tag() string { return strconv.FormatUint(uint64(dedup.MsgTag(o.msgID)), 10) }

// batcher coalesces concurrent calls into pipelines. Its goroutines are
// started by New and stopped by Close.
type batcher struct {
	rdb     goredis.UniversalClient
	max     int
	timeout time.Duration
	wait    int // Options.Wait
	cluster bool

	ops sync.Pool // *op, recycled by do once answered

	mu     sync.Mutex
	q      []*op
	closed bool

	wake   chan struct{}
	stop   chan struct{}
	wg     sync.WaitGroup
	ctx    context.Context // lives until the batchers have drained the queue
	cancel context.CancelFunc
}

func newBatcher(s *Store, opt Options) *batcher {
	b := &batcher{
		rdb: s.rdb, max: opt.MaxBatch, timeout: opt.Timeout, wait: opt.Wait,
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	_, b.cluster = s.rdb.(*goredis.ClusterClient)
	b.ops.New = func() any { return &op{done: make(chan struct{}, 1)} }
	b.ctx, b.cancel = context.WithCancel(context.Background())
	for range opt.Pipelines {
		b.wg.Go(b.run)
	}
	return b
}

// get returns a cleared op for one call.
func (b *batcher) get() *op {
	o := b.ops.Get().(*op)
	*o = op{done: o.done}
	return o
}

// do queues o, waits for its answer or for ctx and, once answered,
// recycles o: the caller must not use it after.
func (b *batcher) do(ctx context.Context, o *op) (dedup.Verdict, error) {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return dedup.Verdict{}, ErrClosed
	}
	b.q = append(b.q, o)
	first := len(b.q) == 1
	b.mu.Unlock()
	if first {
		// Only the first op in an empty queue wakes a batcher: the ones
		// after it are taken with it, or a take that leaves some signals.
		b.signal()
	}
	if d := ctx.Done(); d == nil {
		<-o.done // ctx cannot end: a receive costs less than a select
	} else {
		select {
		case <-o.done:
		case <-d:
			// The command may still run; every outcome is safe to abandon
			// (a claim nobody uses ends with its lease). o is not recycled:
			// its batch still holds it.
			return dedup.Verdict{}, ctx.Err()
		}
	}
	v, err := o.verdict, o.err
	b.ops.Put(o)
	return v, err
}

func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// take moves up to max queued ops into buf. Copying lets the queue and
// each batcher's buf keep their arrays: a queue that restarted from nil
// regrew, and became garbage, at every batch.
func (b *batcher) take(buf []*op) (batch []*op, more bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(b.q), b.max)
	batch = append(buf[:0], b.q[:n]...)
	rest := copy(b.q, b.q[n:])
	clear(b.q[rest:])
	b.q = b.q[:rest]
	return batch, rest > 0
}

// run is one batcher goroutine. While it waits for a reply, calls queue up
// and another batcher (or this one, next) sends them: batches grow with the
// load, with no timer to tune.
func (b *batcher) run() {
	var buf []*op
	for {
		select {
		case <-b.wake:
		case <-b.stop:
			for { // closed is set: drain what was queued before
				batch, _ := b.take(buf)
				if len(batch) == 0 {
					return
				}
				b.exec(batch)
			}
		}
		for {
			batch, more := b.take(buf)
			if len(batch) == 0 {
				break
			}
			if more {
				b.signal()
			}
			b.exec(batch)
			clear(batch) // answered: hold no ops (their callers may have moved on)
			buf = batch
		}
	}
}

func (b *batcher) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	close(b.stop)
	b.wg.Wait()
	b.cancel()
}

// exec sends one batch as a pipeline and answers each op.
func (b *batcher) exec(batch []*op) {
	ctx, cancel := context.WithTimeout(b.ctx, b.timeout)
	defer cancel()
	if b.wait > 0 {
		b.sendWait(ctx, batch)
		return
	}
	b.send(ctx, b.rdb, batch, nil)
}

// send sends batch as one pipeline of c, with a WAIT after it when
// Options.Wait asks for one, and answers each op. cc, when not nil, is the
// cluster client whose node c is.
func (b *batcher) send(ctx context.Context, c goredis.Cmdable, batch []*op, cc *goredis.ClusterClient) {
	pipe := c.Pipeline()
	cmds := make([]*goredis.Cmd, len(batch))
	for i, o := range batch {
		switch o.kind {
		case opClaim:
			o.args = [7]any{"set", &o.key, &o.val, "nx", "get", "px", &o.ttl}
			cmds[i] = pipe.Do(ctx, o.args[:]...)
		case opCommit:
			o.args = [7]any{"set", &o.key, &o.val, "px", &o.ttl}
			cmds[i] = pipe.Do(ctx, o.args[:5]...)
		case opRelease:
			cmds[i] = releaseScript.EvalSha(ctx, pipe, []string{o.key}, o.msgID)
		case opExtend:
			cmds[i] = extendScript.EvalSha(ctx, pipe, []string{o.key}, o.at, o.ttl)
		}
	}
	wait := b.waitCmd(ctx, pipe)
	_, perr := pipe.Exec(ctx)
	b.lost(cc, perr)
	few := b.replicated(wait, perr)
	var again []*op
	for i, o := range batch {
		err := replyErr(cmds[i], perr)
		switch {
		case o.kind == opClaim && err == goredis.Nil:
			o.verdict.Status = dedup.Proceed // the key was free; SET NX took it
			o.finish(few)
		case o.kind == opClaim && err == nil:
			v, _ := cmds[i].Val().(string)
			script, err := o.judge(v)
			if script {
				again = append(again, o)
			} else {
				o.finish(err)
			}
		case (o.kind == opRelease || o.kind == opExtend) && goredis.HasErrorPrefix(err, "NOSCRIPT"):
			again = append(again, o)
		case o.kind == opCommit && err == nil:
			o.finish(few)
		case o.kind == opExtend && err == nil:
			if n, _ := cmds[i].Int(); n == 1 {
				o.finish(few) // a new expiry the replicas may not hold
			} else {
				o.finish(nil)
			}
		default:
			o.finish(b.classify(err))
		}
	}
	if len(again) > 0 {
		b.scripts(ctx, c, again, cc)
	}
}

// classify is the package's classify, except that on a cluster a MOVED or
// ASK that reaches us (go-redis follows them, up to MaxRedirects) is a
// failover or a resharding still settling, not a misconfiguration: it is
// unavailable, and the slot map is reloaded for the retry.
func (b *batcher) classify(err error) error {
	if b.cluster && (goredis.HasErrorPrefix(err, "MOVED") || goredis.HasErrorPrefix(err, "ASK")) {
		b.rdb.(*goredis.ClusterClient).ReloadState(b.ctx)
		return fmt.Errorf("%w: %w", dedup.ErrUnavailable, err)
	}
	return redisconn.Classify(err)
}

// judge decides a claim from the record SET NX GET found. It reports
// whether the claim must run the claim script instead.
func (o *op) judge(v string) (script bool, err error) {
	c := strings.IndexByte(v, ':')
	if c < 2 || (v[0] != 'p' && v[0] != 'd') {
		return false, fmt.Errorf("unexpected value %q at %s: another program writes under this prefix?", v, o.key)
	}
	at, perr := strconv.ParseInt(v[1:c], 10, 64)
	if perr != nil {
		return false, fmt.Errorf("unexpected value %q at %s: %w", v, o.key, perr)
	}
	r := dedup.Record{Until: at, Pending: v[0] == 'p'}
	if !r.Pending {
		// A tag that does not parse matches no message: a republish.
		t, _ := strconv.ParseUint(v[c+1:], 10, 32)
		r.Tag = uint32(t)
	}
	o.verdict = dedup.Judge(r, o.now, dedup.MsgTag(o.msgID))
	if o.verdict.Status == dedup.Duplicate {
		o.verdict.Expires = time.UnixMilli(at)
	}
	return o.verdict.Status == dedup.Proceed, nil
}

// scripts runs the claim and release scripts for ops on c, by EVALSHA,
// and by EVAL for those the server did not know (it restarted since).
func (b *batcher) scripts(ctx context.Context, c goredis.Cmdable, ops []*op, cc *goredis.ClusterClient) {
	run := func(eval bool, ops []*op) []*goredis.Cmd {
		pipe := c.Pipeline()
		cmds := make([]*goredis.Cmd, len(ops))
		for i, o := range ops {
			sc, args := releaseScript, []any{o.msgID}
			switch o.kind {
			case opClaim:
				sc, args = claimScript, []any{o.msgID, o.tag(), o.now, o.at, o.ttl}
			case opExtend:
				sc, args = extendScript, []any{o.at, o.ttl}
			}
			if eval {
				cmds[i] = sc.Eval(ctx, pipe, []string{o.key}, args...)
			} else {
				cmds[i] = sc.EvalSha(ctx, pipe, []string{o.key}, args...)
			}
		}
		wait := b.waitCmd(ctx, pipe)
		_, perr := pipe.Exec(ctx)
		b.lost(cc, perr)
		few := b.replicated(wait, perr)
		for i, cmd := range cmds {
			if err := replyErr(cmd, perr); err != nil {
				cmd.SetErr(err)
			} else if n, _ := cmd.Int(); few != nil && (ops[i].kind == opClaim || ops[i].kind == opExtend) && n == 1 {
				cmd.SetErr(few) // a claim taken, or an expiry moved, that the replicas may not hold
			}
		}
		return cmds
	}
	cmds := run(false, ops)
	var missing []*op
	for i, o := range ops {
		if goredis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			missing = append(missing, o)
			continue
		}
		o.scripted(cmds[i], b.classify)
	}
	if len(missing) > 0 {
		for i, cmd := range run(true, missing) {
			missing[i].scripted(cmd, b.classify)
		}
	}
}

// replyErr is cmd's error in a pipeline whose Exec returned perr. Errors
// are per command, except that go-redis leaves every command of a pipeline
// unanswered and without an error when the connection itself failed with a
// server reply (a WRONGPASS on reconnect): such a command has no value, and
// perr is its error.
func replyErr(cmd *goredis.Cmd, perr error) error {
	if err := cmd.Err(); err != nil || perr == nil || cmd.Val() != nil {
		return err
	}
	return perr
}

// scripted answers an op from its script's reply.
func (o *op) scripted(cmd *goredis.Cmd, classify func(error) error) {
	n, err := cmd.Int()
	if err != nil {
		o.finish(redisconn.Classify(err))
		return
	}
	if o.kind == opClaim {
		switch n {
		case 1:
			o.verdict.Status = dedup.Proceed
		case 2:
			o.verdict = dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Redelivery}
		case 3:
			o.verdict = dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Republish}
		case 4:
			o.verdict.Status = dedup.InFlight
		default:
			o.finish(fmt.Errorf("claim script answered %d", n))
			return
		}
	}
	o.finish(nil)
}
