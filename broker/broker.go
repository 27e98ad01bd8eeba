package broker

import (
	"context"
	"crypto/rsa"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cloud.google.com/go/iam/apiv1/iampb"
	pb "cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"github.com/dedupflow/dedupflow/broker/internal/transcode"
	"github.com/dedupflow/dedupflow/limits"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/types/known/emptypb"
)

// Options configure a Broker. The zero value is an in-memory broker that
// logs nothing and uses the real clock.
type Options struct {
	// DataDir makes the broker durable: topics, subscriptions and every
	// message not yet acknowledged by all its subscriptions survive a crash.
	// Empty keeps everything in memory.
	DataDir string
	// NoSync skips fsync. Published messages then survive the broker
	// process dying (kill -9), not the machine losing power. By default a
	// Publish is answered only after its messages are on disk.
	NoSync bool
	// Logger receives operational messages; nil discards them.
	Logger *slog.Logger
	// Now is the clock; tests inject one to drive ack deadlines, backoff and
	// retention. Nil means time.Now.
	Now func() time.Time
	// PullWait bounds how long a unary Pull waits for a message when none is
	// available (default 5s); StreamingPull is not affected.
	PullWait time.Duration
	// PushKey signs the OIDC tokens of push subscriptions; nil generates a
	// key on first use. See PushPublicKey.
	PushKey *rsa.PrivateKey
	// CompactSize is the log size (bytes) from which it is rewritten as a
	// checkpoint of the live state; later rewrites wait until the log is
	// twice the live state, and never start below it. Zero means 64 MiB.
	CompactSize int64
	// AllowedHosts are host names, besides localhost and IP literals, under
	// which the REST API may be reached (see package localguard).
	AllowedHosts []string
	// Exports names the servers BigQuery and Cloud Storage subscriptions
	// write to.
	Exports ExportOptions
}

// Broker is a Pub/Sub-compatible message broker. It implements the
// google.pubsub.v1 Publisher and Subscriber services; register it on a
// grpc.Server with Register, or let Listen run a server for it.
type Broker struct {
	opts Options
	log  *slog.Logger
	now  func() time.Time
	// anyTopicTransforms is set once a topic has message transforms, so
	// that until then a publish does not take mu to look for them.
	anyTopicTransforms atomic.Bool

	// mu guards all delivery state below. One lock keeps the log order equal
	// to the state order; every operation under it is O(1) or O(log n) per
	// message, so it is held for microseconds.
	mu        sync.Mutex
	topics    map[string]*topic
	subs      map[string]*subscription
	topicByID map[uint64]*topic
	subByID   map[uint64]*subscription
	snaps     map[string]*snapshot
	snapByID  map[uint64]*snapshot
	schemas   map[string]*schema
	policies  map[string]*iampb.Policy // IAM, by resource name
	nextSeq   uint64                   // next message ID
	nextID    uint64                   // next internal topic/subscription ID
	nextLease uint64
	timers    timerHeap
	replaying bool

	wal     *wal // nil in memory
	dirLock *os.File

	closing   chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup // every goroutine the broker starts
	walDone   chan struct{}

	srvMu   sync.Mutex
	servers []*grpc.Server
	rests   []*http.Server

	pub publisherServer
	sub subscriberServer

	pushClient *http.Client    // shared by every push subscription's requests
	pushCtx    context.Context // of every push request; ends at shutdown
	pushStop   context.CancelFunc
	signer     signer

	exportShared // what export subscriptions share: clients, counters
}

// New creates a broker and, with a DataDir, loads its saved state.
func New(opts Options) (*Broker, error) {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.CompactSize <= 0 {
		opts.CompactSize = defaultCompactSize
	}
	if opts.PullWait <= 0 {
		opts.PullWait = 5 * time.Second
	}
	b := &Broker{
		opts:       opts,
		log:        opts.Logger,
		now:        opts.Now,
		topics:     map[string]*topic{},
		subs:       map[string]*subscription{},
		topicByID:  map[uint64]*topic{},
		subByID:    map[uint64]*subscription{},
		snaps:      map[string]*snapshot{},
		snapByID:   map[uint64]*snapshot{},
		nextSeq:    1,
		nextID:     1,
		closing:    make(chan struct{}),
		walDone:    make(chan struct{}),
		pushClient: newPushClient(),
	}
	b.pub.b, b.sub.b = b, b
	// Ack IDs count on from the start time, so that an ack a client still
	// sends from before a restart cannot name a lease of this run (a
	// counter from 0 would ack whatever message got that number now).
	b.nextLease = uint64(max(opts.Now().UnixNano(), 0))
	b.pushCtx, b.pushStop = context.WithCancel(context.Background())
	if opts.DataDir != "" {
		b.mu.Lock()
		err := b.openLog()
		b.mu.Unlock()
		if err != nil {
			b.pushStop()
			if b.wal != nil && b.wal.f != nil {
				b.wal.f.Close()
			}
			if b.dirLock != nil {
				b.dirLock.Close()
			}
			return nil, err
		}
		go func() {
			defer close(b.walDone)
			b.wal.run()
		}()
		b.wg.Add(1)
		go b.runCompactor()
	} else {
		close(b.walDone)
	}
	b.wg.Add(1)
	go b.runTimers()
	b.mu.Lock()
	for _, s := range b.subs { // push and export subscriptions loaded from the log
		b.startPusherLocked(s)
		b.startExporterLocked(s)
	}
	b.mu.Unlock()
	return b, nil
}

// Register adds the broker's services (Publisher, Subscriber, SchemaService) to s.
func (b *Broker) Register(s *grpc.Server) {
	for _, svc := range b.services() {
		s.RegisterService(svc.Desc, svc.Impl)
	}
}

// ServerOptions are the gRPC options the broker needs: requests up to the
// service's 10 MB limit plus framing, and tolerance for the keepalive pings
// the official clients send every 5 minutes (gRPC's default policy would
// answer one that comes a little early with GOAWAY).
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(limits.RequestBytes + 1<<20),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 30 * time.Second, PermitWithoutStream: true}),
	}
}

// ErrAddrInUse is returned by Listen when the address is taken.
var ErrAddrInUse = errors.New("address already in use")

// Listen serves the broker's gRPC and REST APIs on addr ("127.0.0.1:0"
// picks a free port) and returns the address it listens on. The server stops with
// Close or Shutdown.
func (b *Broker) Listen(addr string) (string, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return "", fmt.Errorf("broker: listen on %s: %w (is another broker or emulator running there?)", addr, ErrAddrInUse)
		}
		return "", fmt.Errorf("broker: listen on %s: %w", addr, err)
	}
	if err := b.Serve(lis); err != nil {
		lis.Close()
		return "", err
	}
	return lis.Addr().String(), nil
}

// Serve serves the broker's gRPC services and its REST API on lis in the
// background until Close or Shutdown.
func (b *Broker) Serve(lis net.Listener) error {
	s := grpc.NewServer(ServerOptions()...)
	b.Register(s)
	rest, err := b.restHandler(b.services())
	if err != nil {
		return err
	}
	b.srvMu.Lock()
	defer b.srvMu.Unlock()
	select {
	case <-b.closing:
		return errClosed
	default:
	}
	b.servers = append(b.servers, s)
	b.rests = append(b.rests, b.serveSplit(lis, s, rest))
	return nil
}

// services are the implementations that gRPC and REST requests reach.
func (b *Broker) services() []transcode.Service {
	return []transcode.Service{
		{Desc: &pb.Publisher_ServiceDesc, Impl: &b.pub},
		{Desc: &pb.Subscriber_ServiceDesc, Impl: &b.sub},
		{Desc: &pb.SchemaService_ServiceDesc, Impl: &schemaServer{b: b}},
		// The IAM proto binds POST only; Pub/Sub's REST API reads a
		// policy with GET.
		{Desc: &iampb.IAMPolicy_ServiceDesc, Impl: &iamServer{b: b}, More: map[string][]*annotations.HttpRule{
			"GetIamPolicy": {{Pattern: &annotations.HttpRule_Get{Get: "/v1/{resource=**}:getIamPolicy"}}},
		}},
	}
}

// Shutdown stops the broker gracefully: streaming pulls end, unary calls in
// flight finish (until ctx is done), the log is flushed and closed. Leases
// that were not acknowledged are delivered again after a restart.
func (b *Broker) Shutdown(ctx context.Context) error {
	var err error
	b.closeOnce.Do(func() { err = b.shutdown(ctx) })
	return err
}

// Close stops the broker at once: connections are cut, the log is flushed
// and closed.
func (b *Broker) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return b.Shutdown(ctx)
}

func (b *Broker) shutdown(ctx context.Context) error {
	b.srvMu.Lock()
	close(b.closing)
	servers, rests := b.servers, b.rests
	b.srvMu.Unlock()
	b.pushStop()
	// Streams see closing and end, so GracefulStop only waits for unary calls.
	b.mu.Lock()
	for _, s := range b.subs {
		s.notify()
	}
	b.mu.Unlock()
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			done := make(chan struct{})
			go func() { s.GracefulStop(); close(done) }()
			select {
			case <-done:
			case <-ctx.Done():
				s.Stop()
				<-done
			}
		}()
	}
	for _, h := range rests {
		wg.Go(func() {
			if h.Shutdown(ctx) != nil {
				h.Close()
			}
		})
	}
	wg.Wait()
	b.wg.Wait()
	b.pushClient.CloseIdleConnections()
	b.closeExports()
	var err error
	if b.wal != nil {
		b.wal.close()
		<-b.walDone
		b.wal.fail(errClosed)
		err = b.wal.err
		if errors.Is(err, errClosed) {
			err = nil
		}
		if cerr := b.wal.f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("broker: close log: %w", cerr)
		}
		b.dirLock.Close()
	}
	return err
}

// runTimers expires ack deadlines and ends retry backoffs. It wakes at the
// next due time but at least every 100ms, so an injected clock that jumps
// ahead is noticed promptly.
func (b *Broker) runTimers() {
	defer b.wg.Done()
	const maxSleep = 100 * time.Millisecond
	t := time.NewTimer(maxSleep)
	defer t.Stop()
	for {
		select {
		case <-b.closing:
			return
		case <-t.C:
		}
		b.mu.Lock()
		now := b.nowNanos()
		b.fireTimersLocked(now)
		b.pruneRetainedLocked(now)
		b.pruneSnapshotsLocked(now)
		sleep := maxSleep
		if len(b.timers) > 0 {
			sleep = min(max(time.Duration(b.timers[0].at-now), time.Millisecond), maxSleep)
		}
		b.mu.Unlock()
		t.Reset(sleep)
	}
}

// change runs fn under the broker's lock and then, unless fn failed, waits
// until what it logged is durable: the shape of every call that changes
// state. fn's error is returned as it is.
func (b *Broker) change(ctx context.Context, fn func() error) error {
	b.mu.Lock()
	err := fn()
	off := b.offsetLocked()
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return durable(ctx, b, off)
}

// changeEmpty is change for an RPC that answers nothing.
func (b *Broker) changeEmpty(ctx context.Context, fn func() error) (*emptypb.Empty, error) {
	if err := b.change(ctx, fn); err != nil {
		return nil, err
	}
	return &emptypb.Empty{}, nil
}

// remove finds the resource name with find and deletes it with del, under
// change: the shape of every Delete call.
func remove[T any](ctx context.Context, b *Broker, name string, find func(string) (T, error), del func(T)) (*emptypb.Empty, error) {
	return b.changeEmpty(ctx, func() error {
		r, err := find(name)
		if err != nil {
			return err
		}
		del(r)
		return nil
	})
}

// changeTo is change for an RPC that answers what fn makes.
func changeTo[T any](ctx context.Context, b *Broker, fn func() (T, error)) (T, error) {
	var out T
	err := b.change(ctx, func() (err error) {
		out, err = fn()
		return err
	})
	if err != nil {
		var none T
		return none, err
	}
	return out, nil
}

// NewTestServer starts an in-memory broker on a free loopback port, for
// tests of code that talks to Pub/Sub. Point clients at addr (for example
// with PUBSUB_EMULATOR_HOST) and call stop when done.
func NewTestServer() (addr string, stop func(), err error) {
	b, err := New(Options{})
	if err != nil {
		return "", nil, err
	}
	addr, err = b.Listen("127.0.0.1:0")
	if err != nil {
		b.Close()
		return "", nil, err
	}
	return addr, func() { b.Close() }, nil
}
