package rdmacm

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/goxrc/goxrc/verbs"
)

// ErrNotSupported is returned where RDMA cannot exist: a build without cgo,
// an operating system other than Linux, or a feature the device lacks.
// It is the same value as verbs.ErrNotSupported.
var ErrNotSupported = verbs.ErrNotSupported

// ErrClosed is returned by operations on a closed or nil EventChannel or ID,
// and by waits that a Close interrupted. It is the same value as
// verbs.ErrClosed (net.ErrClosed).
var ErrClosed = verbs.ErrClosed

// ErrPrivateDataTooLong is returned, wrapped in a *PrivateDataError, when
// private data exceeds the budget of the CM message that would carry it.
// The check happens in Go, before any C call, so the ID stays usable.
var ErrPrivateDataTooLong = errors.New("private data too long")

// Private-data budgets of the IB CM messages, with IPv4 or IPv6 addressing
// (the CM header of an IP-addressed REQ takes 36 of the 92 bytes). A peer
// always receives exactly the budget of the message, zero-padded: carry your
// own length field.
const (
	MaxReqPrivateData     = 56  // REQ (rdma_connect on TCP and IB port spaces)
	MaxRepPrivateData     = 196 // REP (rdma_accept)
	MaxRejPrivateData     = 148 // REJ (rdma_reject of a connected-mode request)
	MaxSIDRReqPrivateData = 180 // SIDR REQ (rdma_connect on PortSpaceUDP)
	MaxSIDRRepPrivateData = 136 // SIDR REP (rdma_accept or rdma_reject on PortSpaceUDP)
)

// PrivateDataError reports private data over a message's budget.
type PrivateDataError struct {
	Op    string // the call that would have sent it, e.g. "rdma_connect"
	Len   int    // the length given
	Limit int    // the budget of the message
}

func (e *PrivateDataError) Error() string {
	return fmt.Sprintf("rdmacm: %s: %d bytes of private data, the limit is %d: %v", e.Op, e.Len, e.Limit, ErrPrivateDataTooLong)
}

// Unwrap makes errors.Is(err, ErrPrivateDataTooLong) hold.
func (e *PrivateDataError) Unwrap() error { return ErrPrivateDataTooLong }

func checkPrivateData(op string, limit int, pd []byte) error {
	if len(pd) > limit {
		return &PrivateDataError{Op: op, Len: len(pd), Limit: limit}
	}
	return nil
}

// PortSpace is an RDMA CM port space: which transport a CM id's port numbers
// belong to.
type PortSpace uint16

const (
	PortSpaceIPoIB PortSpace = 0x0002 // RDMA_PS_IPOIB
	PortSpaceTCP   PortSpace = 0x0106 // RDMA_PS_TCP: connected mode (RC), the usual choice
	PortSpaceUDP   PortSpace = 0x0111 // RDMA_PS_UDP: datagrams; connect/accept are SIDR
	PortSpaceIB    PortSpace = 0x013F // RDMA_PS_IB: any QP type, including XRC
)

func (ps PortSpace) String() string {
	switch ps {
	case PortSpaceIPoIB:
		return "IPOIB"
	case PortSpaceTCP:
		return "TCP"
	case PortSpaceUDP:
		return "UDP"
	case PortSpaceIB:
		return "IB"
	}
	return fmt.Sprintf("PortSpace(%#x)", uint16(ps))
}

// EventType is an RDMA CM event (enum rdma_cm_event_type).
type EventType int

const (
	EventAddrResolved    EventType = iota // RDMA_CM_EVENT_ADDR_RESOLVED
	EventAddrError                        // RDMA_CM_EVENT_ADDR_ERROR: Status is a negative errno
	EventRouteResolved                    // RDMA_CM_EVENT_ROUTE_RESOLVED
	EventRouteError                       // RDMA_CM_EVENT_ROUTE_ERROR: Status is a negative errno
	EventConnectRequest                   // RDMA_CM_EVENT_CONNECT_REQUEST: on the listener; Event.ID is the new id
	EventConnectResponse                  // RDMA_CM_EVENT_CONNECT_RESPONSE: REP received; move the QP, then Establish
	EventConnectError                     // RDMA_CM_EVENT_CONNECT_ERROR
	EventUnreachable                      // RDMA_CM_EVENT_UNREACHABLE: no answer, or a SIDR reject (Status 2)
	EventRejected                         // RDMA_CM_EVENT_REJECTED: Status is the IB CM reject reason
	EventEstablished                      // RDMA_CM_EVENT_ESTABLISHED
	EventDisconnected                     // RDMA_CM_EVENT_DISCONNECTED
	EventDeviceRemoval                    // RDMA_CM_EVENT_DEVICE_REMOVAL
	EventMulticastJoin                    // RDMA_CM_EVENT_MULTICAST_JOIN
	EventMulticastError                   // RDMA_CM_EVENT_MULTICAST_ERROR
	EventAddrChange                       // RDMA_CM_EVENT_ADDR_CHANGE
	EventTimewaitExit                     // RDMA_CM_EVENT_TIMEWAIT_EXIT: the QP may now be destroyed or reused
)

var eventNames = [...]string{
	"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
	"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
	"DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
	"TIMEWAIT_EXIT",
}

// String returns the event's name without the RDMA_CM_EVENT_ prefix.
func (t EventType) String() string {
	if t >= 0 && int(t) < len(eventNames) {
		return eventNames[t]
	}
	return fmt.Sprintf("EventType(%d)", int(t))
}

// ConnParam are the connection parameters of Connect and Accept, and those a
// connected-mode event carries (CONNECT_REQUEST, CONNECT_RESPONSE, REJECTED).
// This package never creates QPs: QPNum names the caller's own QP (24 bits).
type ConnParam struct {
	PrivateData        []byte // sent by Connect and Accept; in events, see Event.PrivateData
	ResponderResources uint8
	InitiatorDepth     uint8
	RetryCount         uint8 // ignored by Accept: both ends take the connecting side's (see RetryCountFinite)
	RNRRetryCount      uint8
	FlowControl        bool
	SRQ                bool
	QPNum              uint32
}

// MoveParams replaces attributes the CM computes for MoveQP; a zero field
// keeps the CM's value, and a field whose state's attribute mask lacks it
// (an XRC INI QP has no responder side) is ignored. So a passive side that
// accepts with InitiatorDepth 0 where the request offered reads cannot say
// so here: its QP may then issue reads the peer will refuse (the REP told it
// 0); such a side must issue none.
type MoveParams struct {
	// MinRNRTimer replaces the CM's at RTR, which is 0: a 655 ms
	// back-off after a receiver-not-ready NAK.
	MinRNRTimer uint8
	// ResponderResources and InitiatorDepth are the values given to
	// Accept, for the passive side, whose QP moves before it accepts:
	// until then the CM holds the request's, which the peer may have set
	// past this device's limits (librdmacm's defaults offer the peer
	// device's maximum). ResponderResources becomes the QP's
	// max_dest_rd_atomic at RTR, InitiatorDepth its max_rd_atomic at RTS.
	ResponderResources uint8
	InitiatorDepth     uint8
}

// RetryCountFinite is the largest RetryCount that gives up everywhere: after
// it, a send that no ACK answers fails with a retry-exceeded completion and
// the QP goes to the error state, so a peer that vanished without a word
// (power lost, cable cut) is noticed. 7, the usual choice, means infinite
// retries to soft-RoCE (rxe's completer never counts it down; seen with a
// peer node killed, test/integration's TestTwoNodes), although it is a finite
// count to the InfiniBand specification and to hardware. (The RNR retry
// count's 7 means infinite everywhere, as the specification says.) MoveQP
// holds every QP it moves to RTS to it, whatever the peer asked for.
const RetryCountFinite = 6

// UDParam is what a datagram (SIDR, PortSpaceUDP) event carries: on the
// active side's ESTABLISHED, the remote QP number, the Q_Key and the address
// vector to reach it. The Q_Key is always 0x01234567 with IP addressing.
type UDParam struct {
	QPNum uint32
	QKey  uint32
	AH    verbs.AHAttr
}

// Event is one RDMA CM event, copied out of librdmacm and acknowledged before
// it is delivered, so it stays valid for ever.
type Event struct {
	Type EventType
	// Status is 0, a negative errno (ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR,
	// UNREACHABLE after a timeout), an IB CM reject reason (REJECTED) or a
	// SIDR reply status (UNREACHABLE on PortSpaceUDP).
	Status int
	// ID is the id the event is for. For CONNECT_REQUEST it is the new
	// passive id, which the receiver owns and must Accept, Reject or Close.
	ID *ID
	// Listener is the listening id of a CONNECT_REQUEST, nil otherwise.
	Listener *ID
	Conn     ConnParam // connected-mode parameters (non-UD ids)
	UD       UDParam   // datagram parameters (UD ids)
	// PrivateData is a copy of the message's private data. Its length is
	// always the full budget of the message (zero-padded), or 0 when the
	// event carries none.
	PrivateData []byte
}

// String names the event type and, where the event carries one, its status
// with the status's name (an errno, a reject reason or a SIDR status).
func (e Event) String() string {
	if why := statusName(e.Type, e.ID != nil && e.ID.ud(), e.Status); why != "" {
		return fmt.Sprintf("%v status=%d (%s)", e.Type, e.Status, why)
	}
	return fmt.Sprintf("%v status=%d", e.Type, e.Status)
}

// statusName names an event's Status: an errno when negative, a reject
// reason for REJECTED, a SIDR status for a datagram id's UNREACHABLE; ""
// for 0 and for other events.
func statusName(t EventType, ud bool, status int) string {
	switch {
	case status == 0:
		return ""
	case status < 0:
		return syscall.Errno(-status).Error()
	case t == EventRejected:
		return RejectReason(status).String()
	case t == EventUnreachable && ud:
		return SIDRStatus(status).String()
	}
	return ""
}

// RejectReason is an IB CM reject reason: the Status of a REJECTED event
// (and of RejectError), one of the Reject constants. The constants stay
// untyped ints, as Status is an int: convert a Status to print its name
// (RejectReason(ev.Status)).
type RejectReason int

// String names the reason, such as "stale connection", or prints
// RejectReason(n) for one this package does not name.
func (r RejectReason) String() string {
	if s, ok := rejectNames[int(r)]; ok {
		return s
	}
	return fmt.Sprintf("RejectReason(%d)", int(r))
}

// IB CM reject reasons (Event.Status of REJECTED) that this package names.
const (
	RejectNoQP               = 1
	RejectNoEEC              = 2
	RejectNoResources        = 3
	RejectTimeout            = 4
	RejectUnsupported        = 5
	RejectInvalidCommID      = 6
	RejectInvalidCommInst    = 7
	RejectInvalidServiceID   = 8
	RejectInvalidTransport   = 9
	RejectStaleConn          = 10
	RejectRDCNotExist        = 11
	RejectInvalidGID         = 12
	RejectInvalidLID         = 13
	RejectInvalidSL          = 14
	RejectInvalidTrafficCls  = 15
	RejectInvalidHopLimit    = 16
	RejectInvalidPacketRate  = 17
	RejectPortCMRedirect     = 24
	RejectPortRedirect       = 25
	RejectInvalidMTU         = 26
	RejectInsufficientRespRs = 27
	RejectConsumerDefined    = 28
	RejectInvalidRNRRetry    = 29
	RejectDuplicateLocalComm = 30
	RejectInvalidClassVer    = 31
	RejectInvalidFlowLabel   = 32
	RejectInvalidAltFlowLbl  = 33
)

var rejectNames = map[int]string{
	RejectNoQP: "no QP", RejectNoEEC: "no EEC", RejectNoResources: "no resources",
	RejectTimeout: "timeout", RejectUnsupported: "unsupported request",
	RejectInvalidCommID: "invalid communication id", RejectInvalidCommInst: "invalid communication instance",
	RejectInvalidServiceID: "invalid service id (no listener)", RejectInvalidTransport: "invalid transport type",
	RejectStaleConn: "stale connection", RejectRDCNotExist: "RDC does not exist",
	RejectInvalidGID: "invalid GID", RejectInvalidLID: "invalid LID", RejectInvalidSL: "invalid SL",
	RejectInvalidTrafficCls: "invalid traffic class", RejectInvalidHopLimit: "invalid hop limit",
	RejectInvalidPacketRate: "invalid packet rate", RejectPortCMRedirect: "port CM redirect",
	RejectPortRedirect: "port redirect", RejectInvalidMTU: "invalid MTU",
	RejectInsufficientRespRs: "insufficient responder resources", RejectConsumerDefined: "consumer defined",
	RejectInvalidRNRRetry: "invalid RNR retry", RejectDuplicateLocalComm: "duplicate local communication id",
	RejectInvalidClassVer: "invalid class version", RejectInvalidFlowLabel: "invalid flow label",
	RejectInvalidAltFlowLbl: "invalid alternate flow label",
}

// SIDRStatus is a SIDR reply status: the Status of an UNREACHABLE event on
// a PortSpaceUDP id (and of its RejectError), one of the SIDR constants,
// which stay untyped ints as Status is an int: convert a Status to print
// its name (SIDRStatus(ev.Status)).
type SIDRStatus int

// String names the status, such as "rejected", or prints SIDRStatus(n) for
// one this package does not name.
func (s SIDRStatus) String() string {
	if n, ok := sidrNames[int(s)]; ok {
		return n
	}
	return fmt.Sprintf("SIDRStatus(%d)", int(s))
}

// SIDR reply statuses (Event.Status of UNREACHABLE on a PortSpaceUDP id).
const (
	SIDRUnsupported        = 1 // no datagram listener on that port
	SIDRReject             = 2 // the listener called Reject (or its Accept failed)
	SIDRNoQP               = 3
	SIDRRedirect           = 4
	SIDRUnsupportedVersion = 5
)

var sidrNames = map[int]string{
	SIDRUnsupported: "service not supported (no listener)", SIDRReject: "rejected",
	SIDRNoQP: "no QP", SIDRRedirect: "redirect", SIDRUnsupportedVersion: "unsupported version",
}

// RejectError is returned by waits (WaitEvent, ResolveAddr, ...) when the
// peer or the network refused a connection: a REJECTED event (Status is the
// IB CM reject reason: 8 no listener, 10 stale connection, 28 consumer
// defined, which is also what a mismatched QP type gets) or an UNREACHABLE
// event (Status is a SIDR status on PortSpaceUDP, 2 for a SIDR reject, or a
// negative errno such as -ETIMEDOUT when nobody answered). A refusal (a
// REJECTED event, or a SIDR status) matches syscall.ECONNREFUSED
// (errors.Is), as a refused TCP connect does; a negative Status matches its
// errno.
type RejectError struct {
	Type        EventType // EventRejected or EventUnreachable
	Status      int
	UD          bool   // the id was a datagram (SIDR) id
	PrivateData []byte // the peer's REJ or SIDR REP private data (full budget, zero-padded)
}

// Reason names the status.
func (e *RejectError) Reason() string {
	if e.Status < 0 {
		return syscall.Errno(-e.Status).Error()
	}
	names := rejectNames
	if e.Type == EventUnreachable && e.UD {
		names = sidrNames
	}
	if s, ok := names[e.Status]; ok {
		return s
	}
	return fmt.Sprintf("status %d", e.Status)
}

func (e *RejectError) Error() string {
	what := "connection rejected"
	if e.Type == EventUnreachable {
		what = "peer unreachable"
		if e.UD && e.Status > 0 {
			what = "SIDR request rejected"
		}
	}
	return fmt.Sprintf("rdmacm: %s: %s (%v status %d)", what, e.Reason(), e.Type, e.Status)
}

// Is matches syscall.ECONNREFUSED for a refusal (a REJECTED event, or a
// SIDR status), and the errno of a negative Status.
func (e *RejectError) Is(target error) bool {
	switch {
	case e.Status < 0:
		return target == syscall.Errno(-e.Status)
	case e.Type == EventRejected, e.Type == EventUnreachable && e.UD:
		return target == syscall.ECONNREFUSED
	}
	return false
}

// Stale reports an IB CM stale-connection reject (reason 10): the QP number
// is already in a live connection with that node.
func (e *RejectError) Stale() bool { return e.Type == EventRejected && e.Status == RejectStaleConn }

// Timeout reports an UNREACHABLE event caused by a timeout.
func (e *RejectError) Timeout() bool {
	return e.Status == -int(syscall.ETIMEDOUT)
}

// Temporary is part of the net.Error interface: it is Timeout.
func (e *RejectError) Temporary() bool { return e.Timeout() }

// UnexpectedEventError is returned by WaitEvent when another event than the
// one awaited arrives and it is not an error event with its own type.
type UnexpectedEventError struct {
	Want  EventType
	Event Event
}

func (e *UnexpectedEventError) Error() string {
	if why := statusName(e.Event.Type, e.Event.ID != nil && e.Event.ID.ud(), e.Event.Status); why != "" {
		return fmt.Sprintf("rdmacm: waiting for %v, got %v (status %d: %s)", e.Want, e.Event.Type, e.Event.Status, why)
	}
	return fmt.Sprintf("rdmacm: waiting for %v, got %v (status %d)", e.Want, e.Event.Type, e.Event.Status)
}

// Counters are live objects of this package, for leak checks.
type Counters struct {
	Channels int // event channels not yet closed
	IDs      int // CM ids not yet destroyed, listeners' unclaimed requests included
}
