package cm

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// NetConn returns a net.Conn over c with stream semantics: Write splits its
// data into messages, Read returns bytes in order across message boundaries.
// Deadlines work as on TCP connections, and so does CloseWrite (the value
// has the method, as *net.TCPConn does). net/http and any other net.Conn
// user run over it unchanged. Close closes c. The value also has a method
// Conn() *Conn that returns c, for its Stats and Transport where only the
// net.Conn is at hand (Dialer.DialContext's, NetListener's):
// nc.(interface{ Conn() *cm.Conn }). Do not mix c's Send and Recv with the
// adapter's Write and Read: the adapter holds read data of its own.
//
// The stream buffers what the peer's posted receives hold, about
// WithQueueDepth messages of WithMessageSize bytes each way; a Write beyond
// that waits for the peer to Read, as a TCP write waits on full socket
// buffers. So two peers that each write more than that before reading
// deadlock, over TCP too once past its buffers, only sooner at small sizes.
//
// Its errors are *net.OpError values (Net "rdma", Op "read", "write",
// "close" for CloseWrite, or "set" for a deadline set after Close), as a
// TCP connection's, wrapping cm's errors: errors.Is finds ErrPeerGone,
// net.ErrClosed and os.ErrDeadlineExceeded through them. A connection with
// WithRawMessages has no end-of-stream message: Read after the peer's Close
// fails with ErrPeerGone, not io.EOF, as after a crash, and CloseWrite
// returns ErrNotSupported.
func (c *Conn) NetConn() net.Conn {
	return &streamConn{c: c, buf: make([]byte, c.MaxRecvSize())} // nil c: every call fails as the Conn's
}

// Conn returns the connection the adapter runs over.
func (s *streamConn) Conn() *Conn { return s.c }

type streamConn struct {
	c      *Conn
	closed atomic.Bool // Read and Write fail from Close on, as a TCPConn's

	rmu     sync.Mutex
	buf     []byte
	off, n  int
	readDL  deadline
	writeDL deadline
	writeMu sync.Mutex
}

// deadline is one direction's deadline. Changing it cancels the operation
// in flight, which then re-reads the deadline: a deadline in the past ends
// it, as net.Conn requires (net/http relies on this to abort reads).
// Operations share one context per deadline, made when first needed after
// a change, so that a Read or Write does not allocate one of its own.
type deadline struct {
	mu     sync.Mutex
	t      time.Time
	gen    uint64
	ctx    context.Context // for gen; nil until an operation needs it
	cancel context.CancelFunc
}

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	d.t = t
	d.gen++
	if d.cancel != nil {
		d.cancel()
		d.ctx, d.cancel = nil, nil
	}
	d.mu.Unlock()
}

// context returns the context for attempts under the current deadline, and
// the deadline generation it belongs to.
func (d *deadline) context() (context.Context, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ctx == nil {
		if d.t.IsZero() {
			d.ctx, d.cancel = context.WithCancel(context.Background())
		} else {
			d.ctx, d.cancel = context.WithDeadline(context.Background(), d.t)
		}
	}
	return d.ctx, d.gen
}

func (d *deadline) expired() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.t.IsZero() && !time.Now().Before(d.t)
}

// retry reports whether an attempt that ended with err should run again
// because the deadline moved into the future while it waited.
func (d *deadline) retry(err error, gen uint64) bool {
	if !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.gen != gen && (d.t.IsZero() || time.Now().Before(d.t))
}

// opErr is the adapter's error for op: a *net.OpError, as net.Conn users
// (net/http) expect, around err without cm's own OpError (the net.OpError
// names the operation and the addresses). The end of ctx, the deadline's,
// becomes os.ErrDeadlineExceeded; any other error stays as it is, even one
// that wraps a context error of its own.
func (s *streamConn) opErr(op string, ctx context.Context, err error) error {
	if ctx != nil && ctx.Err() != nil && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)) {
		err = os.ErrDeadlineExceeded
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Err != nil {
		err = oe.Err
	}
	return &net.OpError{Op: op, Net: "rdma", Source: s.c.LocalAddr(), Addr: s.c.RemoteAddr(), Err: err}
}

func (s *streamConn) Read(p []byte) (int, error) {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.closed.Load() {
		return 0, s.opErr("read", nil, net.ErrClosed)
	}
	if len(p) == 0 {
		return 0, nil // before the deadline, as a TCP connection's Read
	}
	if s.readDL.expired() {
		return 0, s.opErr("read", nil, os.ErrDeadlineExceeded)
	}
	for s.off == s.n {
		ctx, gen := s.readDL.context()
		n, err := s.c.Recv(ctx, s.buf)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			if s.readDL.retry(err, gen) {
				continue
			}
			return 0, s.opErr("read", ctx, err)
		}
		s.off, s.n = 0, n
	}
	k := copy(p, s.buf[s.off:s.n])
	s.off += k
	return k, nil
}

func (s *streamConn) Write(p []byte) (int, error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	if s.closed.Load() {
		return 0, s.opErr("write", nil, net.ErrClosed)
	}
	if s.writeDL.expired() { // even for no data, as a TCP connection's Write
		return 0, s.opErr("write", nil, os.ErrDeadlineExceeded)
	}
	written := 0
	for written < len(p) {
		chunk := min(len(p)-written, s.c.MaxMessageSize())
		ctx, gen := s.writeDL.context()
		err := s.c.Send(ctx, p[written:written+chunk])
		if err != nil {
			if s.writeDL.retry(err, gen) {
				continue
			}
			return written, s.opErr("write", ctx, err)
		}
		written += chunk
	}
	return written, nil
}

// Close closes the connection and stops the deadlines' timers. What was
// received and not yet read is dropped. It returns once the end of the
// stream is sent and the data before it delivered; the release of the
// connection, which waits for the CM's time-wait, goes on in the background
// (a TCP socket's TIME_WAIT is the kernel's too), so that net/http, which
// closes its connections one by one, does not wait a time-wait for each.
// Where the peer vanished without a word, the wait for delivery lasts until
// the device's retries run out (about 15 s on soft-RoCE; at most the
// handshake timeout). A TCP socket's Close leaves that to the kernel, which
// delivers after the process exits; here the data would die with the
// process, so Close does not return before it is delivered or lost.
func (s *streamConn) Close() error {
	s.closed.Store(true)
	err := s.c.ownClose(true)
	s.readDL.set(time.Time{})
	s.writeDL.set(time.Time{})
	return err
}

// CloseWrite ends the stream's writing side, as TCP's half-close does
// (Conn.CloseWrite): the peer reads io.EOF after the data written so far,
// and reading goes on until the peer ends its own side. Proxies that copy
// each direction until EOF rely on it. Its error is a *net.OpError with Op
// "close", as *net.TCPConn's CloseWrite's.
func (s *streamConn) CloseWrite() error {
	if err := s.c.CloseWrite(); err != nil {
		return s.opErr("close", nil, err)
	}
	return nil
}

func (s *streamConn) LocalAddr() net.Addr  { return s.c.LocalAddr() }
func (s *streamConn) RemoteAddr() net.Addr { return s.c.RemoteAddr() }

func (s *streamConn) SetDeadline(t time.Time) error      { return s.setDeadlines(t, true, true) }
func (s *streamConn) SetReadDeadline(t time.Time) error  { return s.setDeadlines(t, true, false) }
func (s *streamConn) SetWriteDeadline(t time.Time) error { return s.setDeadlines(t, false, true) }

// setDeadlines sets the read deadline, the write deadline or both; after
// Close it fails with net.ErrClosed (a *net.OpError, Op "set"), as a TCP
// connection's setters do.
func (s *streamConn) setDeadlines(t time.Time, read, write bool) error {
	if s.closed.Load() {
		return s.opErr("set", nil, net.ErrClosed)
	}
	if read {
		s.readDL.set(t)
	}
	if write {
		s.writeDL.set(t)
	}
	return nil
}
