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
)

// Claim script, for the claims that must overwrite a record (see the
// package doc). It decides again on the server, atomically: the record may
// have changed since SET NX GET read it.
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
)

// op is one queued call.
type op struct {
	kind  uint8
	key   string
	msgID string
	tag   uint32
	now   int64 // ms
	at    int64 // lease-until or expiry, ms
	ttl   int64 // ms, for Redis to drop the key

	verdict dedup.Verdict
	err     error
	done    chan struct{}
}

func (o *op) finish(err error) {
	o.err = err
	close(o.done)
}

// batcher coalesces concurrent calls into pipelines. Its goroutines are
// started by New and stopped by Close.
type batcher struct {
	rdb     goredis.UniversalClient
	max     int
	timeout time.Duration

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
		rdb: s.rdb, max: opt.MaxBatch, timeout: opt.Timeout,
		wake: make(chan struct{}, 1), stop: make(chan struct{}),
	}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	for range opt.Pipelines {
		b.wg.Go(b.run)
	}
	return b
}

// do queues o and waits for its answer or for ctx.
func (b *batcher) do(ctx context.Context, o *op) error {
	o.done = make(chan struct{})
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return ErrClosed
	}
	b.q = append(b.q, o)
	b.mu.Unlock()
	b.signal()
	select {
	case <-o.done:
		return o.err
	case <-ctx.Done():
		// The command may still run; every outcome is safe to abandon
		// (a claim nobody uses ends with its lease).
		return ctx.Err()
	}
}

func (b *batcher) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *batcher) take() (batch []*op, more bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := min(len(b.q), b.max)
	batch = b.q[:n:n]
	if n == len(b.q) {
		b.q = nil
	} else {
		b.q = b.q[n:]
	}
	return batch, len(b.q) > 0
}

// run is one batcher goroutine. While it waits for a reply, calls queue up
// and another batcher (or this one, next) sends them: batches grow with the
// load, with no timer to tune.
func (b *batcher) run() {
	for {
		select {
		case <-b.wake:
		case <-b.stop:
			for { // closed is set: drain what was queued before
				batch, _ := b.take()
				if len(batch) == 0 {
					return
				}
				b.exec(batch)
			}
		}
		for {
			batch, more := b.take()
			if len(batch) == 0 {
				break
			}
			if more {
				b.signal()
			}
			b.exec(batch)
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
	pipe := b.rdb.Pipeline()
	cmds := make([]*goredis.Cmd, len(batch))
	for i, o := range batch {
		switch o.kind {
		case opClaim:
			v := "p" + strconv.FormatInt(o.at, 10) + ":" + o.msgID
			cmds[i] = pipe.Do(ctx, "set", o.key, v, "nx", "get", "px", o.ttl)
		case opCommit:
			v := "d" + strconv.FormatInt(o.at, 10) + ":" + strconv.FormatUint(uint64(o.tag), 10)
			cmds[i] = pipe.Do(ctx, "set", o.key, v, "px", o.ttl)
		case opRelease:
			cmds[i] = releaseScript.EvalSha(ctx, pipe, []string{o.key}, o.msgID)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are per command, read below
	var again []*op
	for i, o := range batch {
		err := cmds[i].Err()
		switch {
		case o.kind == opClaim && err == goredis.Nil:
			o.verdict.Status = dedup.Proceed // the key was free; SET NX took it
			o.finish(nil)
		case o.kind == opClaim && err == nil:
			v, _ := cmds[i].Val().(string)
			script, err := o.judge(v)
			if script {
				again = append(again, o)
			} else {
				o.finish(err)
			}
		case o.kind == opRelease && goredis.HasErrorPrefix(err, "NOSCRIPT"):
			again = append(again, o)
		default:
			o.finish(classify(err))
		}
	}
	if len(again) > 0 {
		b.scripts(ctx, again)
	}
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
	rest := v[c+1:]
	switch {
	case v[0] == 'd' && o.now < at:
		o.verdict = dedup.Verdict{Status: dedup.Duplicate, Kind: dedup.Republish}
		if rest == strconv.FormatUint(uint64(o.tag), 10) {
			o.verdict.Kind = dedup.Redelivery
		}
		return false, nil
	case v[0] == 'p' && o.now < at:
		o.verdict.Status = dedup.InFlight
		return false, nil
	}
	return true, nil
}

// scripts runs the claim and release scripts for ops, by EVALSHA, and by
// EVAL for those the server did not know (it restarted since).
func (b *batcher) scripts(ctx context.Context, ops []*op) {
	run := func(eval bool, ops []*op) []*goredis.Cmd {
		pipe := b.rdb.Pipeline()
		cmds := make([]*goredis.Cmd, len(ops))
		for i, o := range ops {
			sc, args := releaseScript, []any{o.msgID}
			if o.kind == opClaim {
				sc = claimScript
				args = []any{o.msgID, strconv.FormatUint(uint64(o.tag), 10), o.now, o.at, o.ttl}
			}
			if eval {
				cmds[i] = sc.Eval(ctx, pipe, []string{o.key}, args...)
			} else {
				cmds[i] = sc.EvalSha(ctx, pipe, []string{o.key}, args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		return cmds
	}
	cmds := run(false, ops)
	var missing []*op
	for i, o := range ops {
		if goredis.HasErrorPrefix(cmds[i].Err(), "NOSCRIPT") {
			missing = append(missing, o)
			continue
		}
		o.scripted(cmds[i])
	}
	if len(missing) > 0 {
		for i, cmd := range run(true, missing) {
			missing[i].scripted(cmd)
		}
	}
}

// scripted answers an op from its script's reply.
func (o *op) scripted(cmd *goredis.Cmd) {
	n, err := cmd.Int()
	if err != nil {
		o.finish(classify(err))
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
