package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

// cluster is a Redis Cluster of masters only, started by the bench on
// loopback ports with its files in the bench's scratch folder.
type cluster struct {
	nodes []*clusterNode
}

type clusterNode struct {
	addr string
	pid  int
	ch   *child
	rdb  *goredis.Client // a plain client of this node alone, for INFO
}

// url is the --state that reaches the cluster, its keys under prefix.
func (c *cluster) url(prefix string) string {
	u := "redis://" + c.nodes[0].addr + "/0?cluster=true"
	for _, n := range c.nodes[1:] {
		u += "&addr=" + n.addr
	}
	return u + "&prefix=" + prefix
}

func (c *cluster) stop() {
	for _, n := range c.nodes {
		if n.rdb != nil {
			n.rdb.Close()
		}
		_ = n.ch.stop(5 * time.Second)
	}
}

// startCluster starts masters redis-servers with --cluster-enabled and
// joins them with `redis-cli --cluster create`, which splits the 16384
// slots evenly among them.
func (e *env) startCluster(ctx context.Context, masters int) (*cluster, error) {
	bin, err := exec.LookPath(e.cfg.redis)
	if err != nil {
		return nil, errAbsent{fmt.Sprintf("Redis Cluster: %s not found (Debian: apt-get install redis-server); the replicas section was not measured", e.cfg.redis)}
	}
	cli, err := exec.LookPath(filepath.Join(filepath.Dir(bin), "redis-cli"))
	if err != nil {
		if cli, err = exec.LookPath("redis-cli"); err != nil {
			return nil, errAbsent{"Redis Cluster: redis-cli not found (Debian: apt-get install redis-tools); the replicas section was not measured"}
		}
	}
	c := &cluster{}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	for i := range masters {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(e.tmp, fmt.Sprintf("cluster-%d", i))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("make cluster node folder: %w", err)
		}
		ch, err := startChild(fmt.Sprintf("redis cluster node %d", i), filepath.Join(dir, "redis.log"), dir, nil, bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--save", "", "--appendonly", "no", "--dir", dir)
		if err != nil {
			return nil, err
		}
		n := &clusterNode{addr: fmt.Sprintf("127.0.0.1:%d", port), pid: ch.cmd.Process.Pid, ch: ch}
		c.nodes = append(c.nodes, n)
		if err := waitPort(ctx, ch, n.addr, 20*time.Second); err != nil {
			return nil, err
		}
		n.rdb = goredis.NewClient(&goredis.Options{Addr: n.addr})
	}
	args := []string{"--cluster", "create"}
	for _, n := range c.nodes {
		args = append(args, n.addr)
	}
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("redis-cli %s: %w: %s", strings.Join(args, " "), err, out)
	}
	// The nodes agree on the slots by gossip, a moment after create.
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range c.nodes {
		for {
			info, err := n.rdb.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("redis cluster node %s not ready after 30s: %v %q", n.addr, err, info)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	ok = true
	e.logf("redis cluster of %d masters on %s", masters, c.addrs())
	return c, nil
}

func (c *cluster) addrs() string {
	var a []string
	for _, n := range c.nodes {
		a = append(a, n.addr)
	}
	return strings.Join(a, ", ")
}

// errAbsent is a contender that is not installed: reported, not failed.
type errAbsent struct{ what string }

func (e errAbsent) Error() string { return e.what }

// nodeStats is what one node has done so far: its counters from INFO and
// its CPU time.
type nodeStats struct {
	commands, reads, netIn, netOut, usedMemory, keys int64
	calls                                            map[string]int64 // per command, from INFO commandstats
	cpu                                              time.Duration
}

func (n *clusterNode) stats(ctx context.Context) (nodeStats, error) {
	info, err := n.rdb.Info(ctx, "stats", "memory", "commandstats", "keyspace").Result()
	if err != nil {
		return nodeStats{}, fmt.Errorf("redis node %s: info: %w", n.addr, err)
	}
	s := parseInfo(info)
	if s.cpu, err = testenv.ProcessCPU(n.pid); err != nil {
		return s, err
	}
	return s, nil
}

// parseInfo reads the counters the bench uses from INFO's text.
func parseInfo(info string) nodeStats {
	s := nodeStats{calls: map[string]int64{}}
	fields := map[string]*int64{"total_commands_processed": &s.commands, "total_reads_processed": &s.reads,
		"total_net_input_bytes": &s.netIn, "total_net_output_bytes": &s.netOut, "used_memory": &s.usedMemory}
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		if p, ok := fields[k]; ok {
			*p, _ = strconv.ParseInt(v, 10, 64)
		}
		if name, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			calls, _, _ := strings.Cut(strings.TrimPrefix(v, "calls="), ",")
			s.calls[name], _ = strconv.ParseInt(calls, 10, 64)
		}
		if k == "db0" {
			keys, _, _ := strings.Cut(strings.TrimPrefix(v, "keys="), ",")
			s.keys, _ = strconv.ParseInt(keys, 10, 64)
		}
	}
	return s
}

// snapshot reads every node's stats.
func (c *cluster) snapshot(ctx context.Context) ([]nodeStats, error) {
	var out []nodeStats
	var errs []error
	for _, n := range c.nodes {
		s, err := n.stats(ctx)
		out = append(out, s)
		errs = append(errs, err)
	}
	return out, errors.Join(errs...)
}

// flush empties every node, so each run starts from the same memory.
func (c *cluster) flush(ctx context.Context) error {
	for _, n := range c.nodes {
		if err := n.rdb.FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("redis node %s: flushall: %w", n.addr, err)
		}
	}
	return nil
}

// sub is what happened between two snapshots of one node.
func (s nodeStats) sub(before nodeStats) nodeStats {
	d := nodeStats{commands: s.commands - before.commands, reads: s.reads - before.reads, netIn: s.netIn - before.netIn,
		netOut: s.netOut - before.netOut, usedMemory: s.usedMemory - before.usedMemory, keys: s.keys - before.keys,
		cpu: s.cpu - before.cpu, calls: map[string]int64{}}
	for k, v := range s.calls {
		if x := v - before.calls[k]; x > 0 {
			d.calls[k] = x
		}
	}
	return d
}
