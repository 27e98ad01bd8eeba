// Package redisconn connects to Redis as --state names it and tells its
// failures apart, for the dedup store (store/redis) and the audit's Redis
// target (audit/redisaudit) alike, so neither imports the other.
//
// A URL is redis://[user:pass@]host:port/db or rediss:// for TLS, with
// go-redis's query options (dial_timeout=, pool_size=, ...) and three of
// ours: cluster=true connects to a Redis Cluster (more seed nodes with
// addr=host:port), prefix= names the keys' prefix and wait=N the replicas
// each write waits for.
package redisconn

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/internal/redact"
)

// URLOptions are the query options of ours, which go-redis does not know.
type URLOptions struct {
	// Cluster is cluster=true: connect to a Redis Cluster.
	Cluster bool
	// Prefix is prefix=, "" when absent.
	Prefix string
	// Wait is wait=N, the replicas each write waits for.
	Wait int
}

// Dial connects to the Redis named by rawURL and pings it, so a wrong
// address or password fails here rather than on first use.
func Dial(ctx context.Context, rawURL string) (rdb goredis.UniversalClient, uo URLOptions, err error) {
	// net/url's and go-redis's parse errors quote the URL whole.
	defer func() { err = redact.Error(err) }()
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, uo, fmt.Errorf("parse redis url: %w", err)
	}
	q := u.Query()
	if v := q.Get("cluster"); v != "" {
		switch v {
		case "true", "1":
			uo.Cluster = true
		case "false", "0":
		default:
			return nil, uo, fmt.Errorf("redis url: cluster=%q: want true or false", v)
		}
	}
	if q.Has("prefix") {
		uo.Prefix = q.Get("prefix")
		if uo.Prefix == "" {
			return nil, uo, errors.New("redis url: empty prefix=")
		}
	}
	if q.Has("wait") {
		n, err := strconv.Atoi(q.Get("wait"))
		if err != nil || n < 0 {
			return nil, uo, fmt.Errorf("redis url: wait=%q: want a number of replicas, 0 or more", q.Get("wait"))
		}
		uo.Wait = n
	}
	q.Del("cluster")
	q.Del("prefix")
	q.Del("wait")
	u.RawQuery = q.Encode()
	if uo.Cluster {
		co, err := goredis.ParseClusterURL(u.String())
		if err != nil {
			return nil, uo, fmt.Errorf("parse redis cluster url %s: %w", u.Redacted(), err)
		}
		co.ContextTimeoutEnabled = true
		rdb = goredis.NewClusterClient(co)
	} else {
		if q.Has("addr") {
			return nil, uo, fmt.Errorf("redis url %s: addr= needs cluster=true", u.Redacted())
		}
		o, err := goredis.ParseURL(u.String())
		if err != nil {
			return nil, uo, fmt.Errorf("parse redis url %s: %w", u.Redacted(), err)
		}
		// Socket deadlines follow each batch's context: without this a
		// retry starts a fresh read timeout after the deadline has passed,
		// and a frozen Redis goes unnoticed for two or three of them.
		o.ContextTimeoutEnabled = true
		rdb = goredis.NewClient(o)
	}
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, uo, fmt.Errorf("connect to redis %s: %w", u.Redacted(), Classify(err))
	}
	return rdb, uo, nil
}

// Classify tells the two kinds of failure apart. Errors worth retrying
// later wrap dedup.ErrUnavailable: anything that is not a reply from the
// server (refused, reset, timeout, closed pool) and the replies of a
// server that is starting, failing over, full or out of memory. Replies
// that retrying cannot fix wrap dedup.ErrFatal: refused credentials or
// permissions, a database that does not exist, a plain client talking to
// a cluster (MOVED; a cluster client of the store judges it for itself) or the reverse, a server too old for the
// commands. Other replies are returned as they are.
func Classify(err error) error {
	if err == nil || errors.Is(err, dedup.ErrUnavailable) || errors.Is(err, dedup.ErrFatal) {
		// Told apart already: a WAIT's answer is shared by every op of
		// its pipeline, and some classify it again.
		return err
	}
	var re goredis.Error
	if errors.As(err, &re) && !errors.Is(err, context.DeadlineExceeded) {
		msg := re.Error()
		for _, p := range transientReplies {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %w", dedup.ErrUnavailable, err)
			}
		}
		for _, p := range fatalReplies {
			if strings.HasPrefix(msg, p) {
				return fmt.Errorf("%w: %w", dedup.ErrFatal, err)
			}
		}
		return err
	}
	return fmt.Errorf("%w: %w", dedup.ErrUnavailable, err)
}

var (
	transientReplies = []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "NOREPLICAS", "OOM",
		"MISCONF", "ERR max number of clients reached"}
	fatalReplies = []string{"WRONGPASS", "NOAUTH", "NOPERM", "ERR DB index is out of range", "ERR invalid DB index",
		"ERR This instance has cluster support disabled", "MOVED", "ASK", "ERR unknown command", "ERR syntax error"}
)
