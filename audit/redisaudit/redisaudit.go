// Package redisaudit keeps the audit filter in Redis, pooled by every
// replica of a pipeline, so it survives restarts and a late copy is
// recognised whichever replica emitted the original.
//
// # Layout
//
// One Redis string per generation, holding the generation's Bloom filter
// bits (little-endian 64-bit words), named
//
//	prefix + "audit:{" + params + "}:" + epoch
//
// where params names the filter's shape (generation width, count, bits,
// hashes): pipelines configured differently never mix their bits. A sorted
// set beside them (":epochs") lists the generations. The braces are a
// Cluster hash tag, so every key of one shape lives in one slot and the
// multi-key commands below work on Redis Cluster too.
//
// # Save
//
// Every generation this process added keys to since the last save is
// written to a temporary key and ORed into the shared one with BITOP OR,
// atomically on the server, so replicas saving at once lose nothing (a
// Bloom filter's union is the OR of its bits). The shared result is read
// back and ORed into this process's filter: each replica learns what the
// others emitted, at most one save interval late. Each generation key
// expires the audit horizon plus two generations after its last save, so
// Redis frees it once it has left every replica's window.
//
// # Cost
//
// One generation is capacity/generations keys at about 21 bits each: 2.7
// MiB at the defaults (10M keys per 7 days, 8 generations). In processing
// time only the current generation changes, so a save writes and reads
// about that much per replica per interval.
package redisaudit

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/audit"
	"github.com/dedupflow/dedupflow/internal/redact"
	"github.com/dedupflow/dedupflow/internal/redisconn"
)

// DefaultPrefix is the dedup store's default prefix, so one --state URL
// puts both under one name.
const DefaultPrefix = "dedupflow:"

// Options configure a Target.
type Options struct {
	// Prefix of every key; default DefaultPrefix, or the URL's prefix=.
	Prefix string
	// Logger; nil discards.
	Logger *slog.Logger
}

// Target is an audit.Target in Redis.
type Target struct {
	rdb    goredis.UniversalClient
	own    bool
	prefix string
	log    *slog.Logger
	name   string
}

var _ audit.Target = (*Target)(nil)

// Open connects to the Redis named by rawURL, in the --state syntax of the
// dedup store: redis:// or rediss://, go-redis's query options, and
// prefix= and cluster=true (more seed nodes with addr=host:port).
func Open(ctx context.Context, rawURL string, opt Options) (*Target, error) {
	rdb, uo, err := redisconn.Dial(ctx, rawURL)
	if err != nil {
		return nil, err
	}
	if uo.Prefix != "" {
		opt.Prefix = uo.Prefix
	}
	t := New(rdb, opt)
	t.own, t.name = true, redact.URL(rawURL)
	return t, nil
}

// New returns a Target over a client the caller made and closes.
func New(rdb goredis.UniversalClient, opt Options) *Target {
	if opt.Prefix == "" {
		opt.Prefix = DefaultPrefix
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	return &Target{rdb: rdb, prefix: opt.Prefix, log: opt.Logger, name: "redis"}
}

// Close closes the client if Open made it.
func (t *Target) Close() error {
	if !t.own {
		return nil
	}
	if err := t.rdb.Close(); err != nil {
		return fmt.Errorf("close redis client: %w", err)
	}
	return nil
}

func (t *Target) String() string { return t.name + " (" + t.prefix + "audit:*)" }

func (t *Target) base(f *audit.Filter) string { return t.prefix + "audit:{" + f.Params() + "}" }

// Load implements audit.Target: it ORs every saved generation into f.
func (t *Target) Load(ctx context.Context, f *audit.Filter) (bool, error) {
	base := t.base(f)
	epochs, err := t.rdb.ZRange(ctx, base+":epochs", 0, -1).Result()
	if err != nil {
		return false, fmt.Errorf("list audit generations: %w", err)
	}
	found := false
	for _, e := range epochs {
		epoch, err := strconv.ParseInt(e, 10, 64)
		if err != nil {
			continue // not ours
		}
		b, err := t.rdb.Get(ctx, base+":"+e).Bytes()
		if errors.Is(err, goredis.Nil) {
			continue // expired
		}
		if err != nil {
			return found, fmt.Errorf("read audit generation %d: %w", epoch, err)
		}
		if err := f.Merge(audit.Generation{Epoch: epoch, Words: words(b)}); err != nil {
			return found, fmt.Errorf("merge audit generation %d: %w", epoch, err)
		}
		found = true
	}
	return found, nil
}

// Save implements audit.Target: it pools this process's new bits with the
// other replicas' and takes theirs back.
func (t *Target) Save(ctx context.Context, f *audit.Filter) error {
	base := t.base(f)
	keep := f.Horizon() + 2*f.Width()
	var errs []error
	for _, g := range f.TakeDirty() {
		if err := t.exchange(ctx, f, base, keep, g); err != nil {
			f.MarkDirty(g.Epoch) // try again next time
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (t *Target) exchange(ctx context.Context, f *audit.Filter, base string, keep time.Duration, g audit.Generation) error {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	key := base + ":" + strconv.FormatInt(g.Epoch, 10)
	tmp := base + ":tmp:" + hex.EncodeToString(rnd[:])
	var get *goredis.StringCmd
	_, err := t.rdb.TxPipelined(ctx, func(p goredis.Pipeliner) error {
		p.Set(ctx, tmp, bytes(g.Words), time.Minute)
		p.BitOpOr(ctx, key, key, tmp)
		p.Del(ctx, tmp)
		p.PExpire(ctx, key, keep)
		p.ZAdd(ctx, base+":epochs", goredis.Z{Score: float64(g.Epoch), Member: strconv.FormatInt(g.Epoch, 10)})
		// Generations older than the window are dropped from the list.
		p.ZRemRangeByScore(ctx, base+":epochs", "-inf", "("+strconv.FormatInt(g.Epoch-int64(keep/f.Width()), 10))
		p.PExpire(ctx, base+":epochs", keep)
		get = p.Get(ctx, key)
		return nil
	})
	if err != nil {
		return fmt.Errorf("save audit generation %d: %w", g.Epoch, err)
	}
	b, err := get.Bytes()
	if err != nil {
		return fmt.Errorf("read back audit generation %d: %w", g.Epoch, err)
	}
	if err := f.Merge(audit.Generation{Epoch: g.Epoch, Words: words(b)}); err != nil {
		return fmt.Errorf("merge audit generation %d: %w", g.Epoch, err)
	}
	return nil
}

func bytes(w []uint64) []byte {
	b := make([]byte, 8*len(w))
	for i, x := range w {
		binary.LittleEndian.PutUint64(b[8*i:], x)
	}
	return b
}

func words(b []byte) []uint64 {
	w := make([]uint64, len(b)/8)
	for i := range w {
		w[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return w
}
