package cm

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/goxrc/goxrc/internal/bitnames"
)

// Region is memory registered with a connection's device for one-sided
// RDMA (Conn.RegisterMemory). Hand its Descriptor to the peer (in a message)
// to let the peer read or write it; Close revokes that access. A nil or zero
// Region is a closed one.
type Region struct {
	mem  memory
	size int // len(mem.bytes()) while registered: Bytes is nil after Close
	// mu is read-held from a one-sided operation's checks to its
	// completion, so that Close cannot deregister the memory in between;
	// only Close write-locks it.
	mu     sync.RWMutex
	closed bool
}

// RemoteRegion describes a peer's Region: enough to read or write it, and
// nothing more. It travels as 16 bytes (Marshal, UnmarshalRemoteRegion).
type RemoteRegion struct {
	Addr uint64 // the region's first byte in the peer's address space
	Len  uint32 // its length in bytes
	RKey uint32 // its remote key, which the peer's device checks
}

// RemoteRegionLen is the length of a marshalled RemoteRegion.
const RemoteRegionLen = 16

// Marshal encodes r for sending to the peer.
func (r RemoteRegion) Marshal() []byte {
	b := make([]byte, RemoteRegionLen)
	binary.BigEndian.PutUint64(b, r.Addr)
	binary.BigEndian.PutUint32(b[8:], r.Len)
	binary.BigEndian.PutUint32(b[12:], r.RKey)
	return b
}

// UnmarshalRemoteRegion decodes a descriptor received from a peer. It
// rejects, with ErrProtocol, one of the wrong length and one whose range
// would wrap past the end of the address space (WriteRemote and ReadRemote
// add offsets to Addr).
func UnmarshalRemoteRegion(b []byte) (RemoteRegion, error) {
	if len(b) != RemoteRegionLen {
		return RemoteRegion{}, fmt.Errorf("cm: %w: remote region descriptor of %d bytes, want %d", ErrProtocol, len(b), RemoteRegionLen)
	}
	r := RemoteRegion{
		Addr: binary.BigEndian.Uint64(b),
		Len:  binary.BigEndian.Uint32(b[8:]),
		RKey: binary.BigEndian.Uint32(b[12:]),
	}
	if r.Addr > math.MaxUint64-uint64(r.Len) {
		return RemoteRegion{}, fmt.Errorf("cm: %w: remote region [%#x, +%d) wraps the address space", ErrProtocol, r.Addr, r.Len)
	}
	return r, nil
}

// ok reports whether r was made by RegisterMemory (a nil or zero Region
// has no memory).
func (r *Region) ok() bool { return r != nil && r.mem != nil }

// Bytes returns the region's memory. It lives outside the Go heap and is
// valid until Close. A nil Region has none, as a closed one.
func (r *Region) Bytes() []byte {
	if !r.ok() {
		return nil
	}
	return r.mem.bytes()
}

// Descriptor returns what the peer needs to access this region (the zero
// RemoteRegion for a nil Region, as for a closed one).
func (r *Region) Descriptor() RemoteRegion {
	if !r.ok() {
		return RemoteRegion{}
	}
	return RemoteRegion{Addr: r.mem.addr(), Len: uint32(len(r.mem.bytes())), RKey: r.mem.rkey()}
}

// Close deregisters the region: later remote accesses fail on the peer and
// break the connection, on this side too (RegisterMemory), so revoke a
// region the peer is done with. It
// waits for this side's one-sided operations on the region to return,
// which they do once the device is done with their requests, or, on a
// failed connection, once the flush came, its bound (the handshake timeout)
// passed or the connection's Close released its QP; the deregistration
// itself takes the device's access away from a request still posted. An
// operation that finds Close under way fails with ErrClosed at once. A
// Region holds its connection's device (its protection domain) until Close,
// also after the connection ends. Close is idempotent; if the
// deregistration fails, the region stays registered, and usable, and Close
// may be called again. Close of a nil Region does nothing, as Conn's does.
func (r *Region) Close() error {
	if !r.ok() {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	if err := r.mem.close(); err != nil {
		return fmt.Errorf("cm: close region: %w", err)
	}
	r.closed = true
	return nil
}

// errRegionClosed: the local region of a one-sided operation was closed.
var errRegionClosed = fmt.Errorf("local region: %w", ErrClosed)

// Access says what a peer holding a Region's Descriptor may do with it. The
// zero value grants nothing: the region is only the local side of this
// side's WriteRemote (its source) and ReadRemote (its destination).
type Access uint8

const (
	// RemoteRead lets the peer read the region (its ReadRemote).
	RemoteRead Access = 1 << iota
	// RemoteWrite lets the peer write the region (its WriteRemote).
	RemoteWrite
)

// String names the grants, such as "RemoteRead|RemoteWrite"; unknown bits
// print in hex, and the zero value (nothing granted) as "0".
func (a Access) String() string { return bitnames.Join(uint64(a), accessNames) }

var accessNames = []bitnames.Bit{{Mask: uint64(RemoteRead), Name: "RemoteRead"}, {Mask: uint64(RemoteWrite), Name: "RemoteWrite"}}

// RegisterMemory registers size bytes for one-sided operations on this
// connection, with the access access grants the peer (ibv_reg_mr with
// IBV_ACCESS_LOCAL_WRITE, plus IBV_ACCESS_REMOTE_READ and _WRITE as asked).
// A peer's operation that its region does not allow fails at the peer, with
// a remote access error, as one on a revoked region does, and breaks the
// connection on both sides: the device moves this side's queue pair to the
// error state too (an RC responder's class C error).
//
// The registration is on the device's protection domain, which every
// connection of this process on that device shares: a peer of any of them
// that has (or guesses) the Descriptor can reach a region that grants
// access. Grant only what the peer needs, give descriptors only to peers
// trusted with the memory, and Close the region to revoke access.
func (c *Conn) RegisterMemory(size int, access Access) (*Region, error) {
	if !c.ok() {
		return nil, ErrClosed // as the other calls on a nil Conn
	}
	if c.x != nil {
		return nil, c.opErr("register memory", fmt.Errorf("one-sided RDMA over XRC: %w", ErrNotSupported))
	}
	if size <= 0 || int64(size) > 1<<31 {
		return nil, c.opErr("register memory", fmt.Errorf("size %d out of range: %w", size, ErrInvalid))
	}
	if access&^(RemoteRead|RemoteWrite) != 0 {
		return nil, c.opErr("register memory", fmt.Errorf("unknown access bits %#x: %w", uint8(access), ErrInvalid))
	}
	c.mu.Lock()
	err := c.err
	if err == nil && c.closing {
		err = ErrClosed
	}
	c.mu.Unlock()
	if err != nil || !c.io() {
		// A closed connection registers nothing: the Region would hold
		// the device for a connection that is gone.
		return nil, c.opErr("register memory", cmp.Or(err, ErrClosed))
	}
	m, err := c.t.regMem(size, access)
	c.ioDone()
	if err != nil {
		return nil, c.opErr("register memory", err)
	}
	return &Region{mem: m, size: size}, nil
}

// WriteRemote copies n bytes at off in local to roff in the peer's region,
// without involving the peer's CPU, and waits for completion. A request
// cannot be taken back once posted: when ctx ends first, the connection
// breaks (later calls get ErrPeerGone), and WriteRemote returns ctx's error
// once the device has flushed the request, which may outlast ctx (bounded
// by the handshake timeout). A post the device refuses means the queue
// pair broke: the connection fails (ErrPeerGone), as when a Send's post
// fails. The same holds for ReadRemote. A nil local
// region, or one registered on another device, is refused as an argument
// (ErrInvalid); a closed or zero one fails as a closed Region does
// (ErrClosed). A length over what the device takes in one message (its
// port's max_msg_sz: 1 GiB on mlx5, less than a Region's 2 GiB) is refused
// before the post with ErrMessageTooLong, and the connection goes on.
func (c *Conn) WriteRemote(ctx context.Context, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	return c.oneSided(ctx, "rdma write", true, local, off, n, remote, roff)
}

// ReadRemote copies n bytes at roff in the peer's region to off in local.
func (c *Conn) ReadRemote(ctx context.Context, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	return c.oneSided(ctx, "rdma read", false, local, off, n, remote, roff)
}

func (c *Conn) oneSided(ctx context.Context, op string, write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	if !c.ok() {
		return ErrClosed
	}
	if c.x != nil {
		return c.opErr(op, fmt.Errorf("one-sided RDMA over XRC: %w", ErrNotSupported))
	}
	if local == nil {
		return c.opErr(op, fmt.Errorf("no local region: %w", ErrInvalid))
	}
	if !local.ok() {
		return opError(op, c.raddr, errRegionClosed) // a zero Region, as its doc says
	}
	// Written so that no sum can wrap: off+n or roff+n past the top of
	// their types would pass a plain comparison.
	if size := local.size; off < 0 || n < 0 || off > size || n > size-off {
		return c.opErr(op, fmt.Errorf("local range of %d bytes at %d outside the %d-byte region: %w", n, off, size, ErrInvalid))
	}
	if rlen := uint64(remote.Len); roff > rlen || uint64(n) > rlen-roff {
		return c.opErr(op, fmt.Errorf("remote range of %d bytes at %d outside the %d-byte region: %w", n, roff, remote.Len, ErrInvalid))
	}
	if end := roff + uint64(n); remote.Addr > math.MaxUint64-end { // a descriptor built by hand
		return c.opErr(op, fmt.Errorf("remote range of %d bytes at %#x+%d wraps the address space: %w", n, remote.Addr, roff, ErrInvalid))
	}
	if m := c.t.maxMessage(); m > 0 && n > m {
		// Posted, it would fail on the device and break the connection.
		return c.opErr(op, fmt.Errorf("%w: %d bytes, the device's limit %d", ErrMessageTooLong, n, m))
	}
	if err := c.rdmaTurn.Take(ctx); err != nil {
		return c.opErr(op, err)
	}
	defer c.rdmaTurn.Give()
	// A free turn is taken whatever ctx says, and a request posted under
	// an ended ctx would be abandoned at once, breaking the connection.
	if err := ctx.Err(); err != nil {
		return c.opErr(op, err)
	}
	c.mu.Lock()
	if err := c.endedErrLocked(); err != nil {
		c.mu.Unlock()
		return c.opErr(op, err)
	}
	// Out from before the post: a round of another caller may take the
	// completion before this one looks again.
	c.rdmaDone, c.rdmaErr, c.rdmaOut, c.rdmaWaiting = false, nil, true, true
	c.mu.Unlock()
	defer c.oneSidedReturned()
	if !c.io() {
		c.noRDMAOut()
		return c.opErr(op, ErrClosed)
	}
	// Held until the request completes: deregistering memory the device
	// is still using would fail the request, and with it the connection.
	// Only Close write-locks it, so a failed try means Close is under way
	// (waiting for another connection's request, maybe): no waiting here,
	// with c.io() held and ctx unheard.
	if !local.mu.TryRLock() {
		c.ioDone()
		c.noRDMAOut()
		return opError(op, c.raddr, errRegionClosed)
	}
	defer local.mu.RUnlock()
	if local.closed {
		c.ioDone()
		c.noRDMAOut()
		return opError(op, c.raddr, errRegionClosed) // not c.opErr: it would say the connection closed
	}
	err := c.t.postRDMA(write, local, off, n, remote, roff)
	c.ioDone()
	if err != nil {
		c.noRDMAOut()
		if np := (notPostedError{}); errors.As(err, &np) {
			return c.opErr(op, np.error)
		}
		return c.opErr(op, c.rdmaPostErr(err))
	}
	return c.awaitOneSided(ctx, op)
}

// oneSidedReturned records that the one-sided operation's caller is
// leaving (its region with it), for release, which waits for that.
func (c *Conn) oneSidedReturned() {
	c.mu.Lock()
	c.rdmaWaiting = false
	c.waiting.wakeAll()
	c.mu.Unlock()
}

// endedErrLocked is why a one-sided operation cannot start: the
// connection's failure, ErrClosed once Close began; nil while it is up.
func (c *Conn) endedErrLocked() error {
	if c.err == nil && c.closing {
		return ErrClosed
	}
	return c.err
}

// rdmaPostErr is what a one-sided operation whose post failed returns: why
// the connection ended, when it had by then (Close under way: ErrClosed,
// as for an operation in flight); otherwise the queue pair broke, which
// fails the connection as a failed send's post does (ErrPeerGone). It
// returned the post's own error, which matched neither.
func (c *Conn) rdmaPostErr(err error) error {
	c.mu.Lock()
	ended := c.endedErrLocked()
	c.mu.Unlock()
	if ended != nil {
		return ended
	}
	err = fmt.Errorf("%w: post RDMA: %w", ErrPeerGone, err)
	c.fail(err)
	return err
}

// noRDMAOut records that the one-sided request was not posted after all.
func (c *Conn) noRDMAOut() {
	c.mu.Lock()
	c.rdmaOut = false
	c.mu.Unlock()
}

// awaitOneSided waits for the one-sided request just posted to complete:
// until then the device may use the local region's memory, which the
// caller's read lock keeps registered. When the connection fails first
// (Close, the peer gone, ctx ending here), the failure moved the QP to the
// error state, and the request's flushed completion follows: it waits for
// that, bounded by the handshake timeout whatever ctx says, or until
// release has taken the QP. (It returned at the failure, and the caller
// then reused, or Region.Close deregistered, memory a request was still
// posted on.)
func (c *Conn) awaitOneSided(ctx context.Context, op string) error {
	wait, ended := ctx, error(nil) // ended: the ctx error that ended the wait
	flushing := false              // waiting for the flush, on a bound of our own
	for {
		c.mu.Lock()
		done, err := c.rdmaDone, c.rdmaErr
		failed, releasing, broken := c.err, c.releasing, c.cqBroken
		seen := c.rounds.Load()
		c.mu.Unlock()
		if done || releasing {
			if !done {
				<-c.freed // the QP is destroyed or reset: the device is done
			}
			switch {
			case ended != nil:
				// Not wrapped: the connection's later calls must not
				// read as timeouts.
				err = ended
			case !done || err != nil && failed != nil:
				// The connection's failure says more than a flush
				// (and is the request's own, wrapped, when it failed).
				err = failed
			}
			return c.opErr(op, err)
		}
		if failed != nil && !flushing {
			var cancel context.CancelFunc
			wait, cancel = context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			flushing = true
		}
		if broken || flushing && wait.Err() != nil {
			// No flush will come (the CQ failed), or none came within
			// the bound: give the memory back all the same.
			return c.opErr(op, cmp.Or(ended, failed))
		}
		if perr := c.progress(wait, seen); perr != nil {
			if flushing {
				continue // the bound, checked above
			}
			c.mu.Lock()
			done := c.rdmaDone
			c.mu.Unlock()
			if done {
				// The round that woke us completed it as ctx ended
				// (select took ctx of the two): it stands, as the
				// top of the loop says.
				continue
			}
			// The request stays posted, so the connection breaks; its
			// flush is waited for next.
			ended = perr
			c.fail(fmt.Errorf("%w: %s abandoned: %v", ErrPeerGone, op, perr))
		}
	}
}
