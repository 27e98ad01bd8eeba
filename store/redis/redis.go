// Package redis is the dedup store shared by many replicas: the horizon
// lives in Redis (or Redis Cluster), so replicas reading one subscription
// agree on which keys were seen.
//
// # Records
//
// One Redis string per dedup key, named prefix + hex(key) (hex, not raw
// bytes: a raw '{' ... '}' inside a key would act as a Cluster hash tag and
// skew slots). Its value is "p<lease-until-ms>:<message-id>" while a claim
// is pending and "d<expires-ms>:<message-tag>" once committed. Expiry and
// leases are judged by the times passed in, as every store does; Redis also
// drops each key by itself (PX) once it is of no use, measured from the
// latest Claim.Now this store saw, so memory follows the live keys.
//
// # Atomicity and speed
//
// Every call touches one key, and each is atomic on the server:
//
//   - Claim sends SET key pending NX GET PX lease. A new key (the common
//     case) is claimed by that one native command, as cheap as the plain
//     SET NX a hand-rolled dedup would use. If the key exists, its old value
//     comes back and is judged here: a live commit is a Duplicate and a live
//     lease of another message is InFlight, with nothing written. Only a
//     claim that must overwrite (an expired commit, an expired lease, our
//     own earlier claim) runs the claim script, which re-checks and writes
//     atomically.
//   - Commit is SET key done PX ttl: it overwrites whatever is there, as
//     the contract says.
//   - Release is a script: delete only if still pending for this message.
//
// Scripts run by EVALSHA; after a server restart (NOSCRIPT) they are sent
// once with EVAL, which caches them again.
//
// Concurrent calls are coalesced: callers queue their commands and a few
// batcher goroutines owned by the store send whatever is queued as one
// pipeline (up to MaxBatch commands), so a thousand callers cost a few
// round trips instead of a thousand. On Redis Cluster, go-redis splits
// each pipeline by node; since every command names one key, no hash tags or
// slot co-location are needed.
//
// With Options.Wait (wait=N on the URL) each batch ends with WAIT N, sent
// down the same connection as its writes (see wait.go), and a claim that
// took a key or a commit fails as unavailable until N replicas hold it: a
// promoted replica then knows every key a caller was told was written.
//
// Errors from an unreachable or recovering server wrap dedup.ErrUnavailable
// (callers nack and back off); the client reconnects by itself. Replies that
// retrying cannot fix (a refused password or permission, a database that
// does not exist) wrap dedup.ErrFatal (see classify).
package redis

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/redisconn"
)

// MaxHorizon is the longest horizon this store accepts; Redis itself has
// no limit worth naming, this one keeps --horizon sane.
const MaxHorizon = 366 * 24 * time.Hour

// DefaultPrefix is prepended to every key this store writes.
const DefaultPrefix = "dedupflow:"

// ErrClosed is returned by calls on a closed store.
// It is dedup.ErrFatal: a consumer or pipeline still running stops with it,
// rather than redelivering every message for ever.
var ErrClosed = fmt.Errorf("redis store closed: %w", dedup.ErrFatal)

// Options configure a Store.
type Options struct {
	// Logger; nil discards.
	Logger *slog.Logger
	// Prefix of every key; default DefaultPrefix.
	Prefix string
	// MaxBatch is the most commands sent in one pipeline; default 500.
	MaxBatch int
	// Pipelines is how many pipelines may be in flight at once; default 4.
	Pipelines int
	// Timeout bounds one pipeline round trip, retries included; default
	// 3s (go-redis's own read timeout). It is also how long a frozen
	// Redis goes unnoticed: the first op to run out of it marks the store
	// down and the pipeline not ready.
	Timeout time.Duration
	// TTLSlack is added to the time Redis keeps a committed key. Expiry is
	// judged by the times passed in, but Redis frees keys on its own wall
	// clock; with event time the watermark can fall behind the wall clock
	// (a stalled or slow stream), and without slack Redis would forget
	// keys that event time still holds.
	TTLSlack time.Duration
	// Wait is how many replicas must confirm a commit (WAIT) before it
	// returns, and a claim that took a key likewise; 0, the default, returns
	// once the master has it. See wait.go.
	Wait int
}

// Store is the Redis store.
type Store struct {
	rdb    goredis.UniversalClient
	own    bool // close rdb on Close
	log    *slog.Logger
	prefix string
	b      *batcher
	// hw is the latest Claim.Now seen (Unix ms): the clock from which
	// commit TTLs are measured.
	hw     atomic.Int64
	slack  int64 // TTLSlack in ms
	closed atomic.Bool
	once   sync.Once
}

var _ dedup.BatchStore = (*Store)(nil)

// Open connects to the Redis named by rawURL: redis://[user:pass@]host:port/db
// or rediss:// for TLS, with go-redis's query options (dial_timeout=,
// pool_size=, ...) and two of ours: prefix= overrides Options.Prefix and
// cluster=true connects to a Redis Cluster (more seed nodes with
// addr=host:port) and wait=N sets Options.Wait. It pings the server, so a
// wrong address or password fails here rather than on the first message.
func Open(ctx context.Context, rawURL string, opt Options) (*Store, error) {
	opt.Logger = logger(opt.Logger)
	installLog(opt.Logger)
	rdb, uo, err := redisconn.Dial(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if uo.Prefix != "" {
		opt.Prefix = uo.Prefix
	}
	if uo.Wait > 0 {
		opt.Wait = uo.Wait
	}
	s := New(rdb, opt)
	s.own = true
	return s, nil
}

// New returns a store over a client the caller made (and closes after the
// store's Close).
func New(rdb goredis.UniversalClient, opt Options) *Store {
	opt.Logger = logger(opt.Logger)
	installLog(opt.Logger)
	if opt.Prefix == "" {
		opt.Prefix = DefaultPrefix
	}
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 500
	}
	if opt.Pipelines <= 0 {
		opt.Pipelines = 4
	}
	if opt.Timeout <= 0 {
		opt.Timeout = 3 * time.Second
	}
	s := &Store{rdb: rdb, log: opt.Logger, prefix: opt.Prefix, slack: opt.TTLSlack.Milliseconds()}
	s.b = newBatcher(s, opt)
	return s
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

func (s *Store) key(k dedup.Key) string {
	var b [64]byte
	return string(s.appendKey(b[:0], k))
}

func (s *Store) appendKey(b []byte, k dedup.Key) []byte {
	return hex.AppendEncode(append(b, s.prefix...), k[:])
}

// keyVal sets o.key and o.val as two halves of one string, one allocation
// instead of three or four. The value is kind, o.at, ':' and then msgID,
// or the message tag when tag is not 0.
func (s *Store) keyVal(o *op, k dedup.Key, kind byte, msgID string, tag uint32) {
	var a [128]byte // enough unless the prefix or the message ID is long
	b := s.appendKey(a[:0], k)
	n := len(b)
	b = append(b, kind)
	b = strconv.AppendInt(b, o.at, 10)
	b = append(b, ':')
	if tag != 0 {
		b = strconv.AppendUint(b, uint64(tag), 10)
	} else {
		b = append(b, msgID...)
	}
	kv := string(b)
	o.key, o.val = kv[:n], kv[n:]
}

// ms rounds up to a millisecond so a lease or horizon never ends early.
func ms(t time.Time) int64 {
	n := t.UnixNano()
	return n/1e6 + b2i(n%1e6 > 0)
}

func b2i(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

// Claim implements dedup.Store.
func (s *Store) Claim(ctx context.Context, c dedup.Claim) (dedup.Verdict, error) {
	o := s.claimOp(c)
	v, err := s.b.do(ctx, o)
	if err != nil || v.Status != dedup.Duplicate || c.Extend.IsZero() {
		return v, err
	}
	if _, err := s.b.do(ctx, s.extendOp(c)); err != nil {
		return v, fmt.Errorf("extend key: %w", err)
	}
	return v, nil
}

// claimOp is the op of claim c.
func (s *Store) claimOp(c dedup.Claim) *op {
	now := c.Now.UnixMilli() // rounded down: a live record is never judged expired
	for hw := s.hw.Load(); now > hw && !s.hw.CompareAndSwap(hw, now); hw = s.hw.Load() {
	}
	until := ms(c.LeaseUntil)
	o := s.b.get()
	o.kind, o.msgID, o.now, o.at, o.ttl = opClaim, c.MsgID, now, until, max(until-now, 1)
	s.keyVal(o, c.Key, 'p', c.MsgID, 0)
	return o
}

// extendOp is the op that moves the expiry of claim c's duplicate key to
// c.Extend.
func (s *Store) extendOp(c dedup.Claim) *op {
	e := s.b.get()
	e.kind, e.key, e.at = opExtend, s.key(c.Key), ms(c.Extend)
	e.ttl = max(e.at-c.Now.UnixMilli(), 1) + s.slack
	return e
}

// extendScript moves a committed key's expiry later (the sliding horizon),
// keeping its message tag; a claim or a later expiry is left alone. It
// runs in the batcher's pipelines, so under Options.Wait the new expiry is
// confirmed by the replicas like a commit. KEYS[1] key; ARGV: until ms,
// TTL ms. Returns 1 when it moved the expiry.
var extendScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'd' then return 0 end
local c = string.find(v, ':', 2, true)
if not c or tonumber(string.sub(v, 2, c - 1)) >= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], 'd' .. ARGV[1] .. string.sub(v, c), 'PX', ARGV[2])
return 1
`)

// Commit implements dedup.Store.
func (s *Store) Commit(ctx context.Context, k dedup.Key, msgID string, expires time.Time) error {
	_, err := s.b.do(ctx, s.commitOp(k, msgID, expires))
	return err
}

// commitOp is the op that commits k for msgID until expires.
func (s *Store) commitOp(k dedup.Key, msgID string, expires time.Time) *op {
	exp := ms(expires)
	now := s.hw.Load()
	if now == 0 {
		// No claim seen yet (a commit right after a restart): measure the
		// TTL from the wall clock; it only decides when Redis frees memory.
		now = time.Now().UnixMilli()
	}
	o := s.b.get()
	o.kind, o.at, o.ttl = opCommit, exp, max(exp-now, 1)+s.slack
	s.keyVal(o, k, 'd', "", dedup.MsgTag(msgID))
	return o
}

// Release implements dedup.Store.
func (s *Store) Release(ctx context.Context, k dedup.Key, msgID string) error {
	_, err := s.b.do(ctx, s.releaseOp(k, msgID))
	return err
}

func (s *Store) releaseOp(k dedup.Key, msgID string) *op {
	o := s.b.get()
	o.kind, o.key, o.msgID = opRelease, s.key(k), msgID
	return o
}

// Close sends what is queued, stops the batchers and, if Open made the
// client, closes it.
func (s *Store) Close() error {
	var err error
	s.once.Do(func() {
		s.closed.Store(true)
		s.b.close()
		if s.own {
			if e := s.rdb.Close(); e != nil {
				err = fmt.Errorf("close redis client: %w", e)
			}
		}
	})
	return err
}
