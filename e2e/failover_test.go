package e2e

// Issue 19's Redis Cluster failover, driven through the binary as the
// replica tests are (and with their harness): three `dedupflow pipeline`
// processes read one subscription and share a cluster of three masters,
// each with one replica, that the test starts from redis-server. Mid-stream
// one master is killed with SIGKILL; the cluster promotes its replica.
// (Its replica is frozen and cut off a second before, so that it lags as
// a partitioned one would.) Every key must come out and no pipeline may exit. Without wait= a commit
// the dead master acknowledged but had not yet copied is forgotten, and a
// later copy of that key comes out again: the test seeks the subscription
// back to the start once the stream is in, so every key comes again, and
// counts those. With
// wait=1 a commit returns only once the replica holds it, and none leak.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/internal/testenv"
)

const (
	failoverKeys = 4_000
	failoverPace = 10 * time.Second
	failoverAt   = 4 * time.Second
	replicaLag   = time.Second
)

// clusterNode is one redis-server of a test cluster.
type clusterNode struct{ *testenv.Redis }

func (n *clusterNode) client() *goredis.Client {
	return goredis.NewClient(&goredis.Options{Addr: n.Addr()})
}

// role is the node's "role:" from INFO replication ("" if it does not answer).
func (n *clusterNode) role() string {
	c := n.client()
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, _ := c.Info(ctx, "replication").Result()
	for _, l := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "role:"); ok {
			return v
		}
	}
	return ""
}

// startCluster starts 3 masters with a replica each, as an operator would
// (redis-cli --cluster create … --cluster-replicas 1), and waits until
// every node reports the cluster ok and every replica is in sync.
func startCluster(t *testing.T) []*clusterNode {
	t.Helper()
	cli := filepath.Join(filepath.Dir(testenv.RedisServer(t)), "redis-cli")
	if _, err := os.Stat(cli); err != nil {
		cli = testenv.Tool(t, "redis-cli")
	}
	nodes := make([]*clusterNode, 6)
	args := []string{"--cluster", "create"}
	for i := range nodes {
		n := &clusterNode{testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000")}
		nodes[i] = n
		args = append(args, n.Addr())
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	if out, err := exec.Command(cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli %v: %v\n%s", args, err, out)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ok := 0
		for _, n := range nodes {
			c := n.client()
			info, _ := c.ClusterInfo(context.Background()).Result()
			repl, _ := c.Info(context.Background(), "replication").Result()
			c.Close()
			if strings.Contains(info, "cluster_state:ok") && strings.Contains(info, "cluster_known_nodes:6") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				ok++
			}
		}
		if ok == len(nodes) {
			return nodes
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster was not ok with its replicas in sync within 30 s")
		}
	}
}

// clusterURL is a --state URL naming every node as a seed.
func clusterURL(nodes []*clusterNode, query string) string {
	u := "redis://" + nodes[0].Addr() + "?cluster=true"
	for _, n := range nodes[1:] {
		u += "&addr=" + n.Addr()
	}
	if query != "" {
		u += "&" + query
	}
	return u
}

func TestRedisClusterFailover(t *testing.T) {
	t.Parallel()
	t.Run("wait=0", func(t *testing.T) { testClusterFailover(t, "") })
	t.Run("wait=1", func(t *testing.T) { testClusterFailover(t, "wait=1") })
}

func testClusterFailover(t *testing.T, query string) {
	nodes := startCluster(t)
	seed := crashSeed(t)
	e := newCrashEnv(t)
	e.createTopicSub("input", "in-sub")
	e.createTopicSub("output", "out-sub")
	out := readOutput(e, "out-sub")
	state := clusterURL(nodes, query)
	procs := startReplicas(t, e, state)

	keys := crashKeys(failoverKeys, "fk")
	start := time.Now()
	published := e.publishInBackground(t, keys, failoverPace, seed)
	time.Sleep(failoverAt)

	var victim, heir *clusterNode
	for _, n := range nodes {
		if n.role() == "master" {
			victim = n
			break
		}
	}
	vc := victim.client()
	vid, err := vc.Do(context.Background(), "cluster", "myid").Text()
	vc.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		c := n.client()
		repl, _ := c.Info(context.Background(), "replication").Result()
		c.Close()
		if strings.Contains(repl, "master_port:"+strconv.Itoa(victim.Port)+"\r") {
			heir = n
		}
	}
	if heir == nil {
		t.Fatalf("no replica of the master on %d", victim.Port)
	}
	before, _ := out.state()
	// On loopback a replica lags its master by microseconds, and what the
	// master wrote to the link survives its SIGKILL in the kernel's
	// buffers: nothing would be lost. So the replica is frozen and its link
	// cut for replicaLag before the kill, as a partition between them
	// would do: the master acknowledges writes it copies to no one.
	if err := heir.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	vc = victim.client()
	err = vc.Do(context.Background(), "client", "kill", "type", "replica").Err()
	vc.Close()
	if err != nil {
		t.Fatalf("cut the replica's link: %v", err)
	}
	time.Sleep(replicaLag)
	victim.Kill()
	killed := time.Now()
	if err := heir.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for heir.role() != "master" {
		if time.Since(killed) > 30*time.Second {
			t.Fatalf("the replica on %d was not promoted within 30 s of its master's SIGKILL", heir.Port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	promoted := time.Since(killed)
	// The dead node comes back, as an orchestrator would restart it, and
	// rejoins as the replica of its heir: with wait=1 the heir's commits
	// need a replica again.
	victim.Start()
	t.Logf("master %s on %d SIGKILLed %v after the first publish with %d keys through, its replica on %d frozen and its link cut %v before; the replica promoted %v after the kill; the old master restarted as a replica",
		vid[:8], victim.Port, failoverAt, before, heir.Port, replicaLag, promoted.Round(time.Millisecond))

	pub := published()
	t.Log(pub)
	// Every key comes again (same message IDs), so every commit the
	// failover lost shows as a duplicate, not only those of keys that
	// happen to have a later copy.
	if err := e.seekTo("in-sub", start.Add(-time.Second)); err != nil {
		t.Fatalf("seek: %v", err)
	}

	// Done when every key came out, the lease of any claim the dead master
	// held has ended (a copy waiting on it could then come out again) and
	// nothing new came out for 5 s.
	await(t, 120*time.Second, func() (bool, string) {
		seen, quiet := out.state()
		return seen >= len(keys) && time.Since(killed) > claimLeaseWait && quiet > 5*time.Second,
			fmt.Sprintf("%d of %d keys came out", seen, len(keys))
	}, procs...)
	t.Logf("all keys out %v after the first publish", time.Since(start).Round(time.Millisecond))
	for _, p := range procs {
		p.stop()
	}
	out.close(t)

	leaked := out.leaks(t, keys, pub)
	t.Logf("wait=%q: %d of %d keys came out more than once after the failover", query, leaked, len(keys))
	if query != "" && leaked > 0 {
		t.Errorf("with %s %d keys leaked a duplicate, want 0", query, leaked)
	}
}
