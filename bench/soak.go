package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/dedupflow/dedupflow/pubsubio"
)

// The soak: a long run of the pipeline as a user deploys it — `dedupflow
// broker --data-dir` as its own process, `dedupflow pipeline` on the disk
// store writing to PostgreSQL — with republished copies, redeliveries, and
// the pipeline stopped by SIGTERM and killed by SIGKILL on a schedule and
// started again each time. At the end the table must hold exactly the
// published keys; on the way, the resident memory of both processes is
// sampled against a stated bound, and the broker's goroutines must come
// back to their level before the first pipeline connected each time a
// pipeline goes away.

const (
	soakProject = "soak-project"
	soakTopic   = "soak-in"
	soakSub     = "soak-in-sub"
	// Bounds of resident memory the soak holds each process to.
	soakBrokerRSS   = 512 << 20
	soakPipelineRSS = 384 << 20
	// soakRedeliver is the share of acknowledged messages that snapshot
	// seeks deliver a second time.
	soakRedeliver = 0.02
)

// soakPlan is what one soak does.
type soakPlan struct {
	keys       int
	publishFor time.Duration // publishing is spread over this
	term, kill time.Duration // the pipeline is stopped every term and killed every kill
	seekEvery  time.Duration // a snapshot seek (redeliveries) this often
	sample     time.Duration
}

func (c config) soakPlan() soakPlan {
	p := soakPlan{keys: c.soakKeys, publishFor: c.soakFor, term: c.soakTerm, kill: c.soakKill,
		seekEvery: 5 * time.Second, sample: time.Second}
	if c.quick {
		p.seekEvery, p.sample = 2*time.Second, 250*time.Millisecond
	}
	return p
}

// soakSample is one reading of both processes.
type soakSample struct {
	at                 time.Duration // since the soak began
	run                int           // the pipeline's run, from 1; 0 between runs
	brokerRSS, pipeRSS float64       // bytes
	brokerG, pipeG     float64       // goroutines
}

// soakRestart is one end of a pipeline run and what followed it.
type soakRestart struct {
	at       time.Duration
	signal   string
	settle   time.Duration // until the broker's goroutines were back at their level
	firstMsg time.Duration // from the new run's start to its first message; 0: not measured
}

// soak is one soak's state.
type soak struct {
	e     *env
	plan  soakPlan
	bin   string
	dir   string
	start time.Time

	broker     *child
	brokerAddr string
	brokerURL  string // its /metrics
	pipeAddr   string // every run's --metrics-addr
	pgURL      string
	table      string
	db         *pgxpool.Pool
	client     *pubsub.Client
	wl         workload
	published  atomic.Int64
	seeks      atomic.Int64
	lastPub    time.Time // when publishing ended
	drained    time.Time // when every key was in the table and nothing left to deliver

	mu       sync.Mutex
	run      *child
	runs     int
	samples  []soakSample
	restarts []soakRestart
	totals   map[string]float64 // outcomes of finished runs
	last     map[string]float64 // the running one's, at its last scrape
	baseline float64            // the broker's goroutines before any pipeline
	streams  float64            // the most streams the broker showed open on the subscription
	web      *http.Client       // for /metrics pages
}

func (e *env) benchSoak(ctx context.Context) error {
	if e.cfg.postgres == "" {
		e.markAbsent("PostgreSQL: the soak needs a database for its sink; set --postgres or DEDUPFLOW_POSTGRES_URL (scripts/test.sh starts one); the soak did not run")
		return nil
	}
	bin, err := e.buildPipeline(ctx)
	if err != nil {
		return err
	}
	s := &soak{e: e, plan: e.cfg.soakPlan(), bin: bin, dir: filepath.Join(e.tmp, "soak"), pgURL: e.cfg.postgres,
		table: fmt.Sprintf("soak_%d", time.Now().UnixNano()), totals: map[string]float64{}, web: scrapeClient()}
	s.wl = workload{events: s.plan.keys, dupRatio: 0.3, payload: 100, spread: 2000, seed: uint64(time.Now().UnixNano()),
		keyPrefix: fmt.Sprintf("soak%d", time.Now().UnixNano()%1e6)}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("make soak folder: %w", err)
	}
	if err := s.setup(ctx); err != nil {
		s.close()
		return err
	}
	defer s.close()
	e.logf("soak: %s keys with 30%% republished over %v, ~%.0f%% redelivered by snapshot seeks; SIGTERM every %v, SIGKILL every %v",
		inum(s.plan.keys), s.plan.publishFor, soakRedeliver*100, s.plan.term, s.plan.kill)
	if err := s.drive(ctx); err != nil {
		return err
	}
	return s.report()
}

// setup starts the broker and connects to it and to the database.
func (s *soak) setup(ctx context.Context) error {
	ports := make([]int, 3)
	for i := range ports {
		p, err := freePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	s.brokerAddr = fmt.Sprintf("127.0.0.1:%d", ports[0])
	s.brokerURL = fmt.Sprintf("http://127.0.0.1:%d/metrics", ports[1])
	s.pipeAddr = fmt.Sprintf("127.0.0.1:%d", ports[2])
	var err error
	s.broker, err = startChild("dedupflow broker", filepath.Join(s.dir, "broker.log"), s.dir, nil, s.bin, "broker",
		"--listen", s.brokerAddr, "--data-dir", filepath.Join(s.dir, "broker"), "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", ports[1]),
		"--project", soakProject, "--subscription", soakTopic+":"+soakSub, "--log-level", "warn")
	if err != nil {
		return err
	}
	if err := waitPort(ctx, s.broker, s.brokerAddr, 30*time.Second); err != nil {
		return err
	}
	if s.client, err = pubsubio.NewClient(ctx, soakProject, pubsubio.Insecure(s.brokerAddr)...); err != nil {
		return err
	}
	if _, err := s.client.SubscriptionAdminClient.GetSubscription(ctx, &pb.GetSubscriptionRequest{Subscription: s.name("subscriptions", soakSub)}); err != nil {
		return fmt.Errorf("the broker's subscription from --subscription: %w", err)
	}
	if s.db, err = pgxpool.New(ctx, s.pgURL); err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	if err := s.db.Ping(ctx); err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	// The level the broker's goroutines come back to: this connection only.
	m, err := s.scrape(ctx, s.brokerURL)
	if err != nil {
		return err
	}
	s.baseline = m.value("go_goroutines")
	return nil
}

func (s *soak) name(kind, id string) string {
	return fmt.Sprintf("projects/%s/%s/%s", soakProject, kind, id)
}

// streamsSeries names the broker's count of streams open on the soak's
// subscription.
func (s *soak) streamsSeries() string {
	return `dedupflow_broker_open_streaming_pulls{subscription="` + s.name("subscriptions", soakSub) + `"}`
}

func (s *soak) close() {
	s.mu.Lock()
	run := s.run
	s.mu.Unlock()
	if run != nil {
		run.kill()
	}
	if s.client != nil {
		s.client.Close()
	}
	if s.broker != nil {
		if err := s.broker.stop(30 * time.Second); err != nil {
			s.e.fail(fmt.Errorf("soak: %w", err))
		}
	}
	s.web.CloseIdleConnections()
	if s.db != nil {
		_, _ = s.db.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{s.table}.Sanitize())
		s.db.Close()
	}
}

// drive runs the soak: publishing, seeks and sampling in the background,
// restarts on schedule in the foreground, until every key is in the table
// and the subscription is drained.
func (s *soak) drive(ctx context.Context) error {
	s.start = time.Now()
	bg, bctx := errgroup.WithContext(ctx)
	bctx, stopBG := context.WithCancel(bctx)
	published := make(chan struct{})
	bg.Go(func() error {
		err := s.publish(bctx)
		s.lastPub = time.Now()
		close(published)
		return err
	})
	bg.Go(func() error { return s.redeliver(bctx) })
	bg.Go(func() error { return s.sampleLoop(bctx) })
	err := s.restartLoop(bctx, published)
	stopBG()
	if werr := bg.Wait(); werr != nil && !errors.Is(werr, context.Canceled) && err == nil {
		err = werr
	}
	return err
}

// restartLoop starts the pipeline and ends it on schedule, SIGKILL when
// both are due, until the work is done; the last run ends by SIGTERM.
func (s *soak) restartLoop(ctx context.Context, published <-chan struct{}) error {
	if err := s.startRun(ctx, false); err != nil {
		return err
	}
	nextTerm, nextKill := s.start.Add(s.plan.term), s.start.Add(s.plan.kill)
	check := time.NewTicker(time.Second)
	defer check.Stop()
	for {
		due := nextTerm
		if nextKill.Before(due) {
			due = nextKill
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-check.C:
			done, err := s.done(ctx, published)
			if err != nil {
				return err
			}
			if done {
				s.drained = time.Now()
				return s.endRun(ctx, syscall.SIGTERM)
			}
			if exited, err := s.current().exited(); exited {
				return fmt.Errorf("pipeline run %d exited by itself: %v (log: %s)", s.runs, err, s.current().tail())
			}
			continue
		case <-time.After(time.Until(due)):
		}
		sig := syscall.SIGTERM
		if !nextKill.After(nextTerm) {
			sig = syscall.SIGKILL
		}
		if !nextKill.After(due) {
			nextKill = nextKill.Add(s.plan.kill)
		}
		if !nextTerm.After(due) {
			nextTerm = nextTerm.Add(s.plan.term)
		}
		if err := s.restart(ctx, sig, published); err != nil {
			return err
		}
	}
}

// done reports whether everything was published, every key is in the
// table and the broker holds nothing more for the subscription.
func (s *soak) done(ctx context.Context, published <-chan struct{}) (bool, error) {
	select {
	case <-published:
	default:
		return false, nil
	}
	if n, err := s.count(ctx); err != nil || n < s.plan.keys {
		return false, err
	}
	m, err := s.scrape(ctx, s.brokerURL)
	if err != nil {
		return false, err
	}
	l := `{subscription="` + s.name("subscriptions", soakSub) + `"}`
	return m.value("dedupflow_broker_undelivered_messages"+l)+m.value("dedupflow_broker_unacked_messages"+l) == 0, nil
}

// count is the table's rows; 0 before the first run created it.
func (s *soak) count(ctx context.Context) (int, error) {
	var n int
	err := s.db.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()).Scan(&n)
	if err != nil && strings.Contains(err.Error(), "does not exist") {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("count the sink's rows: %w", err)
	}
	return n, nil
}

func (s *soak) current() *child {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.run
}

// startRun starts the next pipeline run; timed, it waits for its first
// message and records how long that took.
func (s *soak) startRun(ctx context.Context, timed bool) error {
	s.mu.Lock()
	s.runs++
	n := s.runs
	s.mu.Unlock()
	run, err := startChild(fmt.Sprintf("pipeline run %d", n), filepath.Join(s.dir, fmt.Sprintf("pipeline-%03d.log", n)), s.dir,
		[]string{"PUBSUB_EMULATOR_HOST=" + s.brokerAddr}, s.bin, "pipeline",
		"--project", soakProject, "--input-subscription", soakSub, "--id-attribute", attrKey, "--horizon", "1h",
		"--state", "file:"+filepath.Join(s.dir, "state.db"), "--sink", s.pgURL, "--table", s.table,
		"--metrics-addr", s.pipeAddr, "--log-format", "json", "--log-level", "warn")
	if err != nil {
		return err
	}
	began := time.Now()
	s.mu.Lock()
	s.run, s.last = run, nil
	s.mu.Unlock()
	if !timed {
		return nil
	}
	for ctx.Err() == nil && time.Since(began) < time.Minute {
		if m, err := s.scrape(ctx, "http://"+s.pipeAddr+"/metrics"); err == nil && m.value("dedupflow_received_total") > 0 {
			s.mu.Lock()
			s.restarts[len(s.restarts)-1].firstMsg = time.Since(began)
			s.mu.Unlock()
			return nil
		}
		if exited, err := run.exited(); exited {
			return fmt.Errorf("pipeline run %d exited by itself: %v (log: %s)", n, err, run.tail())
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("pipeline run %d received nothing within a minute of its start (log: %s)", n, run.tail())
}

// endRun ends the current run with sig; SIGTERM must end it cleanly.
func (s *soak) endRun(ctx context.Context, sig syscall.Signal) error {
	run := s.current()
	if sig == syscall.SIGKILL {
		run.kill()
	} else if err := s.serving(ctx, run); err != nil {
		return err
	} else if err := run.stop(time.Minute); err != nil {
		return err
	} else if run.err != nil {
		return fmt.Errorf("%s: SIGTERM ended it with %v (log: %s)", run.name, run.err, run.tail())
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.last {
		s.totals[k] += v
	}
	s.run, s.last = nil, nil
	return nil
}

// serving waits until run answers on its metrics address. A run that is
// due to stop the moment it started (a slow restart before it used up the
// interval) would otherwise get its SIGTERM before its process has set up
// its signal handling, and die of the signal as any program does then.
func (s *soak) serving(ctx context.Context, run *child) error {
	for began := time.Now(); time.Since(began) < time.Minute; {
		if _, err := s.scrape(ctx, "http://"+s.pipeAddr+"/metrics"); err == nil {
			return nil
		}
		if exited, err := run.exited(); exited {
			return fmt.Errorf("%s exited by itself: %v (log: %s)", run.name, err, run.tail())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s did not serve its metrics within a minute of its start (log: %s)", run.name, run.tail())
}

// restart ends the run with sig, waits for the broker to let go of the
// run's streams and for its goroutines to come back to their level, and
// starts the next run.
func (s *soak) restart(ctx context.Context, sig syscall.Signal, published <-chan struct{}) error {
	at := time.Since(s.start)
	if err := s.endRun(ctx, sig); err != nil {
		return err
	}
	ended := time.Now()
	streams := s.streamsSeries()
	var seen, open float64
	for {
		m, err := s.scrape(ctx, s.brokerURL)
		if err != nil {
			return err
		}
		seen, open = m.value("go_goroutines"), m.value(streams)
		if seen <= s.baseline && open == 0 {
			break
		}
		if time.Since(ended) > 30*time.Second {
			s.e.fail(fmt.Errorf("soak: 30 s after the %s of pipeline run %d the broker still ran %.0f goroutines, %.0f before any pipeline connected, and held %.0f of its streams open",
				signalName(sig), s.runs, seen, s.baseline, open))
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.mu.Lock()
	s.restarts = append(s.restarts, soakRestart{at: at, signal: signalName(sig), settle: time.Since(ended)})
	s.mu.Unlock()
	s.e.logf("soak: %v: run %d ended by %s; the broker's goroutines back at %.0f (level %.0f) after %v",
		at.Round(time.Second), s.runs, signalName(sig), seen, s.baseline, time.Since(ended).Round(time.Millisecond))
	select {
	case <-published: // the backlog may be empty: nothing to time
		return s.startRun(ctx, false)
	default:
		return s.startRun(ctx, true)
	}
}

func signalName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGTERM"
}

// publish sends the workload, paced evenly over the plan's publishing
// time, in steps whose results are all checked before the next.
func (s *soak) publish(ctx context.Context) error {
	msgs := s.wl.plan()
	p := s.client.Publisher(soakTopic)
	defer p.Stop()
	p.PublishSettings.CountThreshold = 1000
	p.PublishSettings.ByteThreshold = 5e6
	step := max(1, len(msgs)/max(1, int(s.plan.publishFor/(100*time.Millisecond))))
	begin := time.Now()
	res := make([]*pubsub.PublishResult, 0, step)
	for i := 0; i < len(msgs); i += step {
		at := begin.Add(time.Duration(float64(s.plan.publishFor) * float64(i) / float64(len(msgs))))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(at)):
		}
		res = res[:0]
		for _, m := range msgs[i:min(i+step, len(msgs))] {
			res = append(res, p.Publish(ctx, &pubsub.Message{Data: s.wl.data(m), Attributes: s.wl.attrs(m)}))
		}
		for j, r := range res {
			if _, err := r.Get(ctx); err != nil {
				return fmt.Errorf("publish message %d of the soak: %w", i+j, err)
			}
		}
		s.published.Add(int64(len(res)))
	}
	return nil
}

// redeliver makes a share of the acknowledged messages come back with
// their message IDs: a snapshot taken, then the subscription sought to it
// after a soakRedeliver share of seekEvery, which makes what was acked in
// between unacknowledged again.
func (s *soak) redeliver(ctx context.Context) error {
	window := time.Duration(float64(s.plan.seekEvery) * soakRedeliver)
	tick := time.NewTicker(s.plan.seekEvery)
	defer tick.Stop()
	sub := s.name("subscriptions", soakSub)
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		snap := s.name("snapshots", "soak-"+strconv.Itoa(i))
		if _, err := s.client.SubscriptionAdminClient.CreateSnapshot(ctx, &pb.CreateSnapshotRequest{Name: snap, Subscription: sub}); err != nil {
			return stopped(ctx, fmt.Errorf("create snapshot: %w", err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(window):
		}
		if _, err := s.client.SubscriptionAdminClient.Seek(ctx, &pb.SeekRequest{Subscription: sub,
			Target: &pb.SeekRequest_Snapshot{Snapshot: snap}}); err != nil {
			return stopped(ctx, fmt.Errorf("seek to snapshot: %w", err))
		}
		if err := s.client.SubscriptionAdminClient.DeleteSnapshot(ctx, &pb.DeleteSnapshotRequest{Snapshot: snap}); err != nil {
			return stopped(ctx, fmt.Errorf("delete snapshot: %w", err))
		}
		s.seeks.Add(1)
	}
}

// stopped is err, or nil once ctx ended: a call the end of the soak cut
// short failed with a gRPC Canceled status, which is no context.Canceled
// for drive to pass over.
func stopped(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
