package cm

import (
	"errors"
	"net"
	"os"

	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc"
)

var (
	// ErrNotSupported is returned where the platform or device lacks a
	// feature, e.g. XRC with WithXRC(XRCRequire) on soft-RoCE.
	ErrNotSupported = verbs.ErrNotSupported

	// ErrClosed is returned by operations on a closed Conn or Listener.
	ErrClosed = net.ErrClosed

	// ErrInvalid is matched (errors.Is) by the error of a call given an
	// option or argument it cannot take: a queue depth out of range, a
	// range outside a Region, options that contradict each other. It is
	// os.ErrInvalid, which the devices' EINVAL errors match as well.
	ErrInvalid = os.ErrInvalid

	// ErrMessageTooLong is returned by Send for a message over the
	// connection's maximum message size, by Recv for a buffer too short
	// for the next message (which stays queued), and by WriteRemote and
	// ReadRemote for a length over what the device takes in one message
	// (its port's max_msg_sz: 1 GiB on mlx5); the connection goes on.
	ErrMessageTooLong = errors.New("message too long")

	// ErrProtocol reports a peer that broke the framing or handshake
	// protocol: garbage headers, sequence gaps, an unknown version, a
	// framed peer that grants no RDMA reads; over XRC, also a Dial to a
	// peer process whose SRQ number proved to name nothing at its node (an
	// earlier connection's first message failed; see docs/xrc-protocol.md).
	ErrProtocol = errors.New("protocol violation by peer")

	// ErrPeerGone reports that the connection was lost: the peer
	// disconnected, died, or the QP went to the error state.
	ErrPeerGone = errors.New("connection lost")

	// ErrDeviceRemoved reports that the RDMA device under a connection or
	// listener went away (rdma link delete, a driver unloaded, a device
	// unplugged) or failed for good (its DEVICE_FATAL event; on the
	// in-memory fabric, the node's FailDevice), and is what a Dial on such
	// a device returns. A connection's error wraps ErrPeerGone as well.
	// Connections and listeners have released what they held on the device
	// by then, on their own; Close still works and returns nil. See
	// "Device removal" and "Device events" in the package doc.
	ErrDeviceRemoved = xrc.ErrDeviceRemoved
)

// requestFailed is how a connection reports a failed work request: what
// went wrong, in the words of its completion status, without the work
// request id and QP number of the *verbs.CompletionError, which errors.As
// still reaches (as errors.Is reaches ErrPeerGone).
type requestFailed struct{ ce *verbs.CompletionError }

func (e *requestFailed) Error() string {
	msg := ErrPeerGone.Error() + ": " + e.ce.Status.String()
	switch e.ce.Status {
	case verbs.WCRetryExcErr:
		msg += " (the peer stopped answering)"
	case verbs.WCRNRRetryExcErr:
		msg += " (the peer had no receive buffer posted)"
	}
	return msg
}

func (e *requestFailed) Unwrap() []error { return []error{ErrPeerGone, e.ce} }

// OpError is the error type of every failed cm operation; it implements
// net.Error.
type OpError = verbs.OpError

func opError(op string, addr net.Addr, err error) error {
	if err == nil {
		return nil
	}
	var oe *OpError
	if errors.As(err, &oe) && oe.Op == op {
		return err
	}
	s := ""
	if addr != nil {
		s = addr.String()
	}
	return &OpError{Op: op, Addr: s, Err: err}
}
