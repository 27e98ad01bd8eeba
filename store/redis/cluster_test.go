package redis

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/dedupflow/dedupflow/dedup"
	"github.com/dedupflow/dedupflow/dedup/storetest"
	"github.com/dedupflow/dedupflow/internal/testenv"
)

// TestCluster runs the suite against a three-master Redis Cluster of the
// test's own, and checks that keys spread over the masters.
func TestCluster(t *testing.T) {
	ctx := context.Background()
	var ports [3]int
	nodes := make([]*goredis.Client, 3)
	for i := range ports {
		ports[i] = testenv.StartRedis(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "2000").Port
		nodes[i] = goredis.NewClient(&goredis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", ports[i])})
		defer nodes[i].Close()
	}
	for i, c := range nodes {
		from, to := i*16384/3, (i+1)*16384/3-1
		if err := c.Do(ctx, "cluster", "addslotsrange", from, to).Err(); err != nil {
			t.Fatalf("addslotsrange on node %d: %v", i, err)
		}
		if i > 0 {
			if err := nodes[0].Do(ctx, "cluster", "meet", "127.0.0.1", ports[i]).Err(); err != nil {
				t.Fatalf("cluster meet: %v", err)
			}
		}
	}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ok := 0
		for _, c := range nodes {
			if info, err := c.ClusterInfo(ctx).Result(); err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:3") {
				ok++
			}
		}
		if ok == len(nodes) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("cluster not ok after 20s")
		}
	}
	url := fmt.Sprintf("redis://127.0.0.1:%d?cluster=true&addr=127.0.0.1:%d", ports[0], ports[1])
	storetest.Run(t, func(t *testing.T) dedup.Store { return open(t, url, Options{}) })

	s := open(t, url, Options{})
	now := time.Now()
	for i := range 300 {
		if _, err := s.Claim(ctx, dedup.Claim{Key: dedup.KeyOf(fmt.Sprint("spread", i)), MsgID: "m", Now: now, LeaseUntil: now.Add(time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	for i, c := range nodes {
		if n, err := c.DBSize(ctx).Result(); err != nil || n < 50 {
			t.Errorf("node %d holds %d keys (%v): keys do not spread", i, n, err)
		}
	}

	// A cluster node read without cluster=true answers MOVED for the keys
	// of other nodes: a misconfiguration, which retrying cannot fix.
	plain := open(t, fmt.Sprintf("redis://127.0.0.1:%d", ports[0]), Options{})
	var err error
	for i := 0; i < 30 && err == nil; i++ {
		err = claimNew(plain, fmt.Sprint("plain", i))
	}
	fatal(t, "claims through a plain client on a cluster node", err)
}
