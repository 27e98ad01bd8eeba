package broker

import (
	"bufio"
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc"
)

// One port serves gRPC and the REST API, as Google's emulator does. Each
// connection is told apart by its first bytes: gRPC clients open with the
// HTTP/2 client preface, REST clients (gcloud, curl) speak HTTP/1.1. The
// gRPC connections go to grpc.Server.Serve itself, not through
// grpc.Server.ServeHTTP, which is slower and lacks some of its features.

// sniffTimeout bounds how long a new connection may take to send its first
// bytes before it is dropped.
const sniffTimeout = 10 * time.Second

// connQueue is a net.Listener fed with connections the splitter accepted.
type connQueue struct {
	addr    net.Addr
	ch      chan net.Conn
	done    chan struct{}
	once    sync.Once
	onClose func()
}

func newConnQueue(addr net.Addr, onClose func()) *connQueue {
	return &connQueue{addr: addr, ch: make(chan net.Conn), done: make(chan struct{}), onClose: onClose}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() {
		close(q.done)
		if q.onClose != nil {
			q.onClose()
		}
	})
	return nil
}

func (q *connQueue) Addr() net.Addr { return q.addr }

// hand gives c to the queue's server, or closes it if the server stopped.
func (q *connQueue) hand(c net.Conn) {
	select {
	case q.ch <- c:
	case <-q.done:
		c.Close()
	}
}

// sniffedConn replays the bytes read to tell the protocol.
type sniffedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *sniffedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// serveSplit serves gRPC (on s) and the REST API on lis until the broker
// stops. The gRPC server owns lis: stopping it closes lis, which ends the
// splitter and the REST server.
func (b *Broker) serveSplit(lis net.Listener, s *grpc.Server, rest http.Handler) *http.Server {
	grpcQ := newConnQueue(lis.Addr(), func() { lis.Close() })
	httpQ := newConnQueue(lis.Addr(), nil)
	hs := &http.Server{
		Handler:           rest,
		ReadHeaderTimeout: sniffTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(b.log.Handler(), slog.LevelWarn),
	}
	b.wg.Add(3)
	go func() {
		defer b.wg.Done()
		// ErrServerStopped: Close or Shutdown came before Serve began,
		// which is a stop, not a failure.
		if err := s.Serve(grpcQ); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			b.log.Error("grpc server stopped", "addr", lis.Addr().String(), "err", err)
		}
	}()
	go func() {
		defer b.wg.Done()
		if err := hs.Serve(httpQ); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
			b.log.Error("REST server stopped", "addr", lis.Addr().String(), "err", err)
		}
	}()
	go func() {
		defer b.wg.Done()
		defer httpQ.Close()
		defer grpcQ.Close()
		var (
			sniffers sync.WaitGroup
			mu       sync.Mutex
			pending  = map[net.Conn]struct{}{}
		)
		for {
			c, err := lis.Accept()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					continue
				}
				break
			}
			mu.Lock()
			pending[c] = struct{}{}
			mu.Unlock()
			sniffers.Go(func() {
				b.route(c, grpcQ, httpQ)
				mu.Lock()
				delete(pending, c)
				mu.Unlock()
			})
		}
		// Connections still silent are cut, not waited for.
		mu.Lock()
		for c := range pending {
			c.Close()
		}
		mu.Unlock()
		sniffers.Wait()
	}()
	return hs
}

// h2Preface opens every HTTP/2 connection (RFC 9113, section 3.4).
var h2Preface = []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")

// route reads as much of the connection's opening as tells HTTP/2 from
// HTTP/1 and hands it on.
func (b *Broker) route(c net.Conn, grpcQ, httpQ *connQueue) {
	_ = c.SetReadDeadline(time.Now().Add(sniffTimeout))
	r := bufio.NewReader(c)
	isH2 := true
	for n := 1; n <= len(h2Preface); n++ {
		p, err := r.Peek(n)
		if err != nil {
			b.log.Debug("connection closed before its first request", "remote", c.RemoteAddr().String(), "err", err)
			c.Close()
			return
		}
		if !bytes.Equal(p, h2Preface[:n]) {
			isH2 = false
			break
		}
	}
	_ = c.SetReadDeadline(time.Time{})
	sc := &sniffedConn{Conn: c, r: r}
	if isH2 {
		grpcQ.hand(sc)
	} else {
		httpQ.hand(sc)
	}
}
