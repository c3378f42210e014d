package kernel

import (
	"context"
	"errors"
	"net/netip"

	"github.com/goxrc/goxrc/verbs"
)

// Handles are opaque, process-local names for kernel objects. Zero is never a
// valid handle. A handle is dead after the call that destroys it.
type (
	XRCD uint64 // an opened XRC domain (one ibv_open_xrcd)
	SRQ  uint64 // an XRC SRQ
	QP   uint64 // an INI QP, or one handle on a TGT QP (created or opened)
	ID   uint64 // an RDMA CM id
)

// ErrDeviceRemoved is what Event returns on an id whose RDMA device went
// away (RDMA_CM_EVENT_DEVICE_REMOVAL; the real kernel CM only): the kernel
// has destroyed its side of the id, and the process is to let go of
// everything on the device.
var ErrDeviceRemoved = errors.New("RDMA device removed")

// XRCDFlags are ibv_open_xrcd's oflags.
type XRCDFlags uint8

const (
	XRCDCreate XRCDFlags = 1 << 0 // O_CREAT: create the domain if the inode has none
	XRCDExcl   XRCDFlags = 1 << 1 // O_EXCL: with XRCDCreate, fail with EINVAL if it exists
)

// Exchange is the kind of CM exchange an id takes part in: its port space and
// QP type.
type Exchange uint8

const (
	// ExchangeXRC: XRC-typed ids on RDMA_PS_IB; the active side is XRC_SEND
	// (INI), the listener and its accepted ids XRC_RECV (TGT). The physical link.
	ExchangeXRC Exchange = iota + 1
	// ExchangeSIDR: RDMA_PS_UDP; connect and accept are a SIDR REQ/REP. The
	// virtual link. Never enters the stale-connection table.
	ExchangeSIDR
	// ExchangeRC: RC-typed ids on RDMA_PS_TCP: the RC fallback.
	ExchangeRC
	// ExchangeIBRC: RC-typed ids on RDMA_PS_IB. Exists because an RC REQ to an
	// XRC listener on the same port space (and the reverse) is rejected by the
	// kernel with status 28, which the engine must tell from an app reject.
	ExchangeIBRC
)

func (e Exchange) String() string {
	switch e {
	case ExchangeXRC:
		return "XRC"
	case ExchangeSIDR:
		return "SIDR"
	case ExchangeRC:
		return "RC"
	case ExchangeIBRC:
		return "IB-RC"
	}
	return "Exchange(?)"
}

// Connected reports whether the exchange is connected mode (REQ/REP/RTU,
// DREQ/DREP, the stale-connection table) rather than SIDR.
func (e Exchange) Connected() bool { return e != ExchangeSIDR }

// EventType is an RDMA CM event of the kinds the engine handles.
type EventType uint8

const (
	EventConnectRequest  EventType = iota + 1 // on a listener; Event.ID is the new id
	EventConnectResponse                      // REP received (QPs not owned by the CM): move the INI, then Establish
	EventEstablished                          // passive: RTU received; SIDR active: the SIDR REP accepted
	EventRejected                             // Status: IB CM reject reason (RejStaleConn, RejConsumerDefined, ...)
	EventUnreachable                          // Status: SIDR status (SIDRNoListener, SIDRRejected), or no answer
	EventDisconnected                         // DREQ received, or DREP received for our DREQ
	EventTimewaitExit                         // the id's QP number may now be reused
)

var eventNames = [...]string{"", "CONNECT_REQUEST", "CONNECT_RESPONSE", "ESTABLISHED", "REJECTED",
	"UNREACHABLE", "DISCONNECTED", "TIMEWAIT_EXIT"}

func (t EventType) String() string {
	if int(t) < len(eventNames) && t != 0 {
		return eventNames[t]
	}
	return "EventType(?)"
}

// Status values seen in EventRejected and EventUnreachable (IB CM numbering).
const (
	RejInvalidServiceID        = 8  // no listener on that port (connected mode)
	RejStaleConn               = 10 // IB_CM_REJ_STALE_CONN
	RejConsumerDefined         = 28 // an rdma_reject, a failed accept, or a QP-type mismatch (zero data)
	SIDRNoListener             = 1  // IB_SIDR_UNSUPPORTED
	SIDRRejected               = 2  // IB_SIDR_REJECT: an rdma_reject of a SIDR request
	SIDRQKey            uint32 = 0x01234567
)

// Event is one CM event, with its private data already copied out (padded by
// the kernel to the carrier's maximum).
type Event struct {
	Type        EventType
	ID          ID     // EventConnectRequest: the new id; otherwise the id waited on
	Status      int    // EventRejected / EventUnreachable
	QPNum       uint32 // the peer's qp_num: REQ's INI QPN, REP's TGT QPN, SIDR REP's qp_num
	QKey        uint32 // SIDR REP
	Remote      netip.AddrPort
	Exchange    Exchange
	PrivateData []byte
}

// QPInfo is what QueryQP reports.
type QPInfo struct {
	Num     uint32
	Type    verbs.QPType // QPTypeXRCSend or QPTypeXRCRecv
	State   verbs.QPState
	DestQPN uint32     // the connected peer QP (RTR and later)
	Remote  netip.Addr // the peer's address (from the address vector)
}

// SendWR is one send on an INI: a message to the remote SRQ RemoteSRQN,
// through the TGT the INI is connected to, with Imm (the receiver's tag).
type SendWR struct {
	WRID       uint64
	RemoteSRQN uint32
	Imm        uint32
	Payload    []byte // copied by PostSend
}

// SendCompletion is the completion of one SendWR.
type SendCompletion struct {
	WRID   uint64
	Status verbs.WCStatus
	QPNum  uint32
}

// RecvCompletion is one message received on an SRQ.
type RecvCompletion struct {
	TGTQPN uint32 // which TGT it came through (wc.qp_num)
	Imm    uint32
	// Payload is a copy from NewPayload, the receiver's: give it back with
	// FreePayload when done.
	Payload []byte
	Status  verbs.WCStatus
}

// Kernel is the seam: everything the XRC engine asks of the kernel, for one
// process on one device. Errors are *verbs.OpError wrapping a syscall.Errno
// where the real call would return one (errors.Is(err, syscall.EAGAIN) ...).
//
// Implementations: internal/kernel/model (in memory, rule for rule after
// facts.md) and the real one over verbs + rdmacm.
type Kernel interface {
	// LocalAddr is the address of this process's RDMA device (its node).
	LocalAddr() netip.Addr
	// XRC reports whether the device supports XRC (IBV_DEVICE_XRC).
	XRC() bool

	// OpenXRCD opens the domain bound to the inode of the file at path ("" =
	// a private domain). EAGAIN: none yet and no XRCDCreate; EINVAL:
	// XRCDCreate|XRCDExcl and it exists.
	OpenXRCD(path string, flags XRCDFlags) (XRCD, error)
	// CloseXRCD closes this handle; EBUSY while this process has QPs or SRQs
	// made through it.
	CloseXRCD(d XRCD) error
	// CreateSRQ creates an XRC SRQ in d, its receives slot bytes each, and
	// returns its number. A longer message fails: its receive completes
	// with WCLocLenErr and its send with WCRemInvReqErr, the INI in ERR.
	CreateSRQ(d XRCD, slot int) (SRQ, uint32, error)
	DestroySRQ(s SRQ) error
	// CreateINI creates an XRC_SEND QP (not bound to any domain).
	CreateINI() (QP, uint32, error)
	// CreateTGT creates an XRC_RECV QP in d; the creator gets a handle like
	// any opener.
	CreateTGT(d XRCD) (QP, uint32, error)
	// OpenTGT adds a handle on the TGT numbered qpn in d (ibv_open_qp: the
	// register). The number may have been reused: verify with QueryQP.
	OpenTGT(d XRCD, qpn uint32) (QP, error)
	// DestroyQP destroys an INI, or removes one TGT handle (the unregister);
	// a TGT dies with its last handle.
	DestroyQP(q QP) error
	QueryQP(q QP) (QPInfo, error)
	// TransitionQP moves q through the needed states up to `to`, taking
	// every step's attributes from the connected-mode CM id via
	// (rdma_init_qp_attr, with per-type masks and min_rnr_timer fixed): the
	// path (peer QPN, address) for RTR, so RTR and RTS need an id whose
	// exchange is live. to = QPStateErr or QPStateReset needs no id.
	TransitionQP(q QP, to verbs.QPState, via ID) error

	// PostSend posts a chain on an INI (RTS, or ERR where everything is
	// flushed; EINVAL before RTS). Once one fails, the INI goes to ERR and
	// the rest is flushed.
	// ENOMEM: the send queue (or the send memory) is full until completions
	// are polled; the requests before the one that did not fit were posted,
	// and the INI is as it was.
	PostSend(q QP, wrs []SendWR) error
	// PollSend waits for at least one send completion on q and fills out.
	// Pollers of one queue may be concurrent; each waits until its own
	// ctx ends, also while another is polling (PollRecv alike).
	PollSend(ctx context.Context, q QP, out []SendCompletion) (int, error)
	// PollRecv waits for at least one message on s and fills out. A poll
	// whose ctx is live when it begins looks at the queue before it
	// waits: one that returns ctx's error found the queue empty (the
	// engine counts it as a drain, see xrc's receive loop). EINTR: it
	// ended at its deadline without taking what the queue holds (the
	// model's paused process): no drain; poll again. Messages taken may
	// come with an error (the real kernel's repost of their slots
	// failed): n counts them, and they are the caller's all the same.
	PollRecv(ctx context.Context, s SRQ, out []RecvCompletion) (int, error)

	// Listen binds a listener on addr for one exchange. An XRC (or IB-RC)
	// listener and a SIDR listener may share a port number.
	Listen(addr netip.AddrPort, ex Exchange) (ID, error)
	// Connect resolves dst and sends a REQ (connected) or SIDR REQ carrying
	// qpNum and privateData; the answer comes as an event on the id.
	Connect(ctx context.Context, dst netip.AddrPort, ex Exchange, qpNum uint32, privateData []byte) (ID, error)
	// Accept answers a CONNECT_REQUEST (qpNum: our TGT, or SIDR's qp_num). A
	// failed accept rejects the peer.
	Accept(id ID, qpNum uint32, privateData []byte) error
	// Reject answers a CONNECT_REQUEST, or aborts a connect (before or
	// after CONNECT_RESPONSE).
	Reject(id ID, privateData []byte) error
	// Establish sends the RTU after CONNECT_RESPONSE.
	Establish(id ID) error
	// Disconnect sends a DREQ, or the DREP after a DREQ.
	Disconnect(id ID) error
	// DestroyID destroys the id, with whatever the kernel sends for its state.
	DestroyID(id ID) error
	// Event waits for the next event on id.
	Event(ctx context.Context, id ID) (Event, error)

	// DeviceFatal is closed once the device has reported a fatal error
	// (IBV_EVENT_DEVICE_FATAL): nothing on it works any more, nothing
	// reaches the peers, and the process is to let go of everything on it,
	// as after ErrDeviceRemoved. Completions need not come for what was
	// posted, so a poller may wait for ever: this is how the engine learns.
	DeviceFatal() <-chan struct{}

	// Close releases everything of this process, as process exit does.
	Close() error
}
