package xrc

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

var (
	// ErrClosed is returned by operations on a closed Endpoint or Conn.
	ErrClosed = net.ErrClosed
	// ErrPeerClosed is returned by Send and CloseWrite after the peer
	// closed the connection (its FIN arrived); Recv returns io.EOF then.
	ErrPeerClosed = errors.New("xrc: connection closed by peer")
	// ErrMessageTooLong is returned by Send for a message over what the
	// receiver takes (its Config.MaxMessageSize, learned when the leg was
	// set up), and by Recv for a buffer too short for the next message
	// (which stays queued).
	ErrMessageTooLong = errors.New("xrc: message too long")
	// ErrPeerGone reports a peer found dead: its receive queue vanished
	// (a send to its SRQ failed), its sender went silent past the idle
	// timeout, or its INI's CM connection was torn down without a FIN.
	ErrPeerGone = errors.New("xrc: peer gone")
	// ErrDeviceRemoved reports that the endpoint's RDMA device went away
	// (the real kernel CM's DEVICE_REMOVAL) or failed for good (the
	// device's IBV_EVENT_DEVICE_FATAL; memfabric's Node.FailDevice): every
	// connection fails with it, Accept and Dial return it, and the
	// endpoint closes itself, releasing everything it held on the device.
	// NewEndpoint returns it on a device that failed so before or as it
	// opened. cm.ErrDeviceRemoved is the same error.
	ErrDeviceRemoved = kernel.ErrDeviceRemoved
	// ErrNoKernel reports a Config.Process that carries no kernel (a
	// memfabric.Process not made by its Node).
	ErrNoKernel = errors.New("xrc: no kernel (Config.Process was not made by a memfabric Node)")
	// ErrNotSupported is returned where the platform or the device lacks
	// XRC (soft-RoCE, siw, ...: the error names the device and the reason),
	// or RDMA altogether (no Linux or no cgo). It is verbs.ErrNotSupported.
	ErrNotSupported = verbs.ErrNotSupported
	// ErrInvalid is matched (errors.Is) by the error of a Config the
	// endpoint cannot take: a size or window out of range, an address that
	// does not parse (Dial's too), an unspecified address on a device
	// without Config.Device (on a Process it is the node's address),
	// Process and Device both set. It is
	// os.ErrInvalid, as cm.ErrInvalid is.
	ErrInvalid = os.ErrInvalid
	// ErrProtocol reports a peer that broke the protocol: an ACCEPT that
	// does not answer the request, one from a process whose SRQ number
	// proved to name nothing (an earlier leg's first frame failed), or,
	// on an established connection, sending past the credits it was given.
	ErrProtocol = errors.New("xrc: protocol violation by peer")
	// ErrProcessDied reports that the endpoint's process died under it:
	// every kernel object and CM id it held was closed at once, as a
	// kill -9 does (memfabric's Process.Kill, or its node's PowerOff). The
	// endpoint's Err returns it, every connection fails with it, and Accept
	// and Dial return it. It is no Close of the application's: it does not
	// match ErrClosed. Close still ends the endpoint's goroutines.
	ErrProcessDied = errors.New("xrc: the endpoint's process died")

	errSRQGone    = fmt.Errorf("%w: its receive queue is gone", ErrPeerGone)
	errIdle       = fmt.Errorf("%w: silent past the idle timeout", ErrPeerGone)
	errUnanswered = fmt.Errorf("%w: it did not answer", ErrPeerGone)
	// errSendPoll fails the legs of an uplink whose send completions
	// cannot be polled, on a rebuilt INI as on the one before.
	errSendPoll    = errors.New("xrc: send completions cannot be polled (again after the uplink was rebuilt)")
	errAbandoned   = fmt.Errorf("%w: the dialer gave up on the connection", ErrPeerGone)
	errStaleLink   = fmt.Errorf("%w: its INI's CM connection ended without FIN", ErrPeerGone)
	errNoRTU       = fmt.Errorf("%w: the sender never completed its physical link (no RTU)", ErrPeerGone)
	errRetries     = fmt.Errorf("%w: sends keep failing", ErrPeerGone)
	errLegTries    = fmt.Errorf("%w: the leg did not open in 16 tries", ErrPeerGone)
	errIncarnation = fmt.Errorf("%w: answered by another incarnation", ErrPeerGone)
	errUplinkGone  = fmt.Errorf("%w: uplink gone during the request", ErrPeerGone)
	errOverrun     = fmt.Errorf("%w: messages sent past the receive window", ErrProtocol)
	errBadAccept   = fmt.Errorf("%w: its ACCEPT does not answer the request", ErrProtocol)
	errBadReverse  = errors.New("xrc: the peer's reverse leg (in its ACCEPT) failed verification")
	errReverseGone = errors.New("xrc: the TGT the peer's reverse leg (in its ACCEPT) names is not its own")
	// errReverseDomain: the reverse leg is into another domain than ours.
	errReverseDomain = errors.New("xrc: the peer's reverse leg (in its ACCEPT) is into another domain than ours")
	// errReverseRefused: we refused the peer's request for the dial's
	// reverse leg, which it does not ask again.
	errReverseRefused = errors.New("xrc: this endpoint refused the peer's request for the dial's reverse leg")
	// errReverseAborted: the peer's half of the connection failed before
	// its reverse leg was up (its ABORT). The acceptor turned the dial
	// down, so it matches ECONNREFUSED, as its REJECTs do (RejectError).
	errReverseAborted = fmt.Errorf("xrc: the peer could not open the dial's reverse leg: %w", syscall.ECONNREFUSED)
)

// RejectReason is why a peer refused a connection request.
type RejectReason uint8

const (
	// RejectVersion: the peer speaks no protocol version of ours.
	RejectVersion RejectReason = RejectReason(wire.RejectVersion)
	// RejectNoXRC: the peer's device or process has no XRC.
	RejectNoXRC RejectReason = RejectReason(wire.RejectNoXRC)
	// RejectTGTGone: the target QP the request named is gone at the peer;
	// the dialer rebuilds its uplink and asks again by itself.
	RejectTGTGone RejectReason = RejectReason(wire.RejectTGTGone)
	// RejectDomainMismatch: the request named another XRC domain than the
	// peer node's; the dialer learns the right one and asks again.
	RejectDomainMismatch RejectReason = RejectReason(wire.RejectDomainMismatch)
	// RejectBusyRetry: the peer cannot take the request now (its endpoint
	// is closing, it is out of resources, or it does not yet know the leg
	// being moved); a later request may succeed.
	RejectBusyRetry RejectReason = RejectReason(wire.RejectBusyRetry)
	// RejectApp: the peer's endpoint refused: it only dials, it has
	// stopped accepting (StopAccepting; a closed cm listener's endpoint
	// has), or its answer did not fit the exchange.
	RejectApp RejectReason = RejectReason(wire.RejectApp)
	// RejectBadRequest: the peer found the request malformed or naming a
	// connection it does not hold.
	RejectBadRequest RejectReason = RejectReason(wire.RejectBadRequest)
	// RejectNoListener: nothing listens on that address (CM status).
	RejectNoListener RejectReason = 100
	// RejectCM: the CM refused the request without our private data
	// (QP-type mismatch, stale connection, timeout: see Status).
	RejectCM RejectReason = 101
)

func (r RejectReason) String() string {
	switch r {
	case RejectNoListener:
		return "NO_LISTENER"
	case RejectCM:
		return "CM_REJECT"
	}
	return wire.RejectReason(r).String()
}

// RejectError reports a connection request the peer (or its CM) refused,
// or one nobody answered. A refusal matches syscall.ECONNREFUSED
// (errors.Is), as a refused TCP dial does; an unanswered request has a
// negative Status, an errno (the CM's is ETIMEDOUT, which Timeout then
// reports), and matches that errno instead. Test for a refusal with
// ECONNREFUSED, not with the type.
type RejectError struct {
	Addr   string
	Reason RejectReason
	Detail uint32 // reason-specific
	Status int    // the CM's reject or SIDR status, or a negative errno
	// SIDR says that a positive Status is a SIDR reply's status
	// (rdmacm.SIDRStatus: a virtual link's exchange), not an IB CM reject
	// reason (rdmacm.RejectReason: the physical link's).
	SIDR   bool
	domain uint64 // the rejecter's domain id
}

// Error leaves the address out: an *OpError around it (Dial's) names it.
func (e *RejectError) Error() string {
	if e.Status < 0 {
		return fmt.Sprintf("connection request unanswered: %v", syscall.Errno(-e.Status))
	}
	return fmt.Sprintf("connection refused: %v (detail %d, CM status %d%s)", e.Reason, e.Detail, e.Status, e.cmStatusName())
}

// cmStatusName names a positive Status after a colon: a SIDR status or an
// IB CM reject reason, as rdmacm names them; "" for 0.
func (e *RejectError) cmStatusName() string {
	switch {
	case e.Status <= 0:
		return ""
	case e.SIDR:
		return ": " + rdmacm.SIDRStatus(e.Status).String()
	}
	return ": " + rdmacm.RejectReason(e.Status).String()
}

// Timeout reports a request nobody answered in time: Status -ETIMEDOUT
// (net.Error).
func (e *RejectError) Timeout() bool { return e.Status == -int(syscall.ETIMEDOUT) }

// Temporary is part of the net.Error interface: it is Timeout.
func (e *RejectError) Temporary() bool { return e.Timeout() }

// Is matches syscall.ECONNREFUSED for a refusal, and the errno of a
// negative Status for a request nobody answered.
func (e *RejectError) Is(target error) bool {
	if e.Status < 0 {
		return target == syscall.Errno(-e.Status)
	}
	return target == syscall.ECONNREFUSED
}

// OpError is the error of a failed Endpoint or Conn operation. It
// implements net.Error, as package cm's OpError does.
type OpError struct {
	Op   string // "listen", "dial", "connect" (a link's exchange), "accept", "send", "recv", "close write"
	Addr string // the endpoint's address, or the peer's; may be empty (a Config without Addr)
	Err  error  // what failed
}

// Error says "xrc: " once: the package's own errors start with it, as
// they are returned bare too (Conn.Err, Endpoint.Err), and lose it here:
// "xrc: send ADDR: connection closed by peer", not "xrc: send ADDR: xrc:
// connection closed by peer".
func (e *OpError) Error() string {
	msg, _ := strings.CutPrefix(e.Err.Error(), "xrc: ")
	if e.Addr == "" {
		return "xrc: " + e.Op + ": " + msg
	}
	return "xrc: " + e.Op + " " + e.Addr + ": " + msg
}

func (e *OpError) Unwrap() error { return e.Err }

// Timeout reports whether the operation timed out: its context's deadline
// passed, or its request went unanswered (a *RejectError that is a
// Timeout).
func (e *OpError) Timeout() bool {
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary is part of the net.Error interface: it is Timeout, as
// RejectError's.
func (e *OpError) Temporary() bool { return e.Timeout() }

var _ net.Error = (*OpError)(nil)
