package verbs

import (
	"fmt"

	"github.com/goxrc/goxrc/internal/bitnames"
	"github.com/goxrc/goxrc/internal/objtrace"
)

// Types shared by the cgo build and the stub build: request descriptions,
// events, and leak counters.

// Transport is a device's transport (enum ibv_transport_type).
type Transport int8

// The transports, with enum ibv_transport_type's values.
const (
	TransportUnknown Transport = -1
	TransportIB      Transport = 0 // InfiniBand and RoCE (soft-RoCE included)
	TransportIWARP   Transport = 1
	TransportUSNIC   Transport = 2
)

func (t Transport) String() string {
	switch t {
	case TransportIB:
		return "IB"
	case TransportIWARP:
		return "iWARP"
	case TransportUSNIC:
		return "usNIC"
	case TransportUnknown:
		return "unknown"
	}
	return fmt.Sprintf("Transport(%d)", int8(t))
}

// DeviceInfo describes an RDMA device before it is opened.
type DeviceInfo struct {
	Name      string
	NodeGUID  uint64 // host order; print with %016x
	Transport Transport
}

// SGE is one scatter/gather element: a range of registered memory.
type SGE struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// SendWR is a send work request. Which fields count depends on Opcode and on
// the QP type: RemoteAddr/RKey for RDMA and atomics, CompareAdd/Swap for
// atomics, RemoteSRQNum for XRC_SEND QPs, AH/RemoteQPN/RemoteQKey for UD.
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	SGL    []SGE
	// Inline, if set, is copied into the QP's own C memory at post time and
	// sent inline (SendInline is implied): no memory registration needed.
	// It is exclusive with SGL and limited by QPCap.MaxInlineData.
	Inline       []byte
	Imm          uint32 // host order; sent in network order
	RemoteAddr   uint64
	RKey         uint32
	CompareAdd   uint64
	Swap         uint64
	RemoteSRQNum uint32
	AH           *AH
	RemoteQPN    uint32
	RemoteQKey   uint32
}

// RecvWR is a receive work request.
type RecvWR struct {
	ID  uint64
	SGL []SGE
}

// SRQInit sizes a shared receive queue. Limit arms the SRQ limit event at
// creation when non-zero (most devices want Arm after posting instead).
type SRQInit struct {
	MaxWR  uint32
	MaxSGE uint32
	Limit  uint32
}

// QPInit describes a QP to create.
//
//   - RC, UC, UD: SendCQ and RecvCQ (may be the same CQ), optional SRQ, Cap.
//   - XRCSend (INI): SendCQ only; no RecvCQ, SRQ or receive caps.
//   - XRCRecv (TGT): XRCD only; no CQs, no SRQ, no caps. Receives land in
//     whatever XRC SRQ of the domain the sender names. PD.CreateQP accepts it
//     (the PD is not used, it must belong to the same device), and so does
//     Context.CreateXRCRecvQP.
type QPInit struct {
	Type   QPType
	SendCQ *CQ
	RecvCQ *CQ
	SRQ    *SRQ
	XRCD   *XRCD
	Cap    QPCap
	SigAll bool // every send completes signaled, whatever its flags
}

// XRCDFlags control how OpenXRCD treats a domain file.
type XRCDFlags uint32

const (
	// XRCDCreate creates the domain if no process on this node has it open
	// (and the file if missing). Without it, opening a domain that does not
	// exist yet fails with EAGAIN.
	XRCDCreate XRCDFlags = 1 << 0
	// XRCDExclusive, with XRCDCreate, fails with EINVAL if the domain exists.
	XRCDExclusive XRCDFlags = 1 << 1
)

// AsyncEventType is an asynchronous device event (enum ibv_event_type).
type AsyncEventType uint32

// The event types, with enum ibv_event_type's values (IBV_EVENT_CQ_ERR ...).
const (
	EventCQErr              AsyncEventType = 0
	EventQPFatal            AsyncEventType = 1
	EventQPReqErr           AsyncEventType = 2
	EventQPAccessErr        AsyncEventType = 3
	EventCommEst            AsyncEventType = 4
	EventSQDrained          AsyncEventType = 5
	EventPathMig            AsyncEventType = 6
	EventPathMigErr         AsyncEventType = 7
	EventDeviceFatal        AsyncEventType = 8
	EventPortActive         AsyncEventType = 9
	EventPortErr            AsyncEventType = 10
	EventLIDChange          AsyncEventType = 11
	EventPKeyChange         AsyncEventType = 12
	EventSMChange           AsyncEventType = 13
	EventSRQErr             AsyncEventType = 14
	EventSRQLimitReached    AsyncEventType = 15
	EventQPLastWQEReached   AsyncEventType = 16
	EventClientReregister   AsyncEventType = 17
	EventGIDChange          AsyncEventType = 18
	EventWQFatal            AsyncEventType = 19
	numAsyncEventTypeValues                = 20
)

var asyncEventNames = [numAsyncEventTypeValues]string{
	"CQ_ERR", "QP_FATAL", "QP_REQ_ERR", "QP_ACCESS_ERR", "COMM_EST", "SQ_DRAINED",
	"PATH_MIG", "PATH_MIG_ERR", "DEVICE_FATAL", "PORT_ACTIVE", "PORT_ERR", "LID_CHANGE",
	"PKEY_CHANGE", "SM_CHANGE", "SRQ_ERR", "SRQ_LIMIT_REACHED", "QP_LAST_WQE_REACHED",
	"CLIENT_REREGISTER", "GID_CHANGE", "WQ_FATAL",
}

func (t AsyncEventType) String() string {
	if int(t) < len(asyncEventNames) {
		return asyncEventNames[t]
	}
	return fmt.Sprintf("AsyncEventType(%d)", uint32(t))
}

// AsyncEvent is one copied and acknowledged asynchronous event. Which fields
// are set depends on Type: QPNum for QP events, SRQ (and SRQNum for XRC
// SRQs) for SRQ events, CQ for CQ errors, Port for port events.
type AsyncEvent struct {
	Type   AsyncEventType
	QPNum  uint32
	SRQ    *SRQ // nil if the SRQ was not created through this Context
	SRQNum uint32
	CQ     *CQ
	Port   uint8
}

// String names the event and what it concerns: a port, an SRQ, a QP, or the
// device.
func (e AsyncEvent) String() string {
	switch {
	case e.Port != 0:
		return fmt.Sprintf("%v port %d", e.Type, e.Port)
	case e.SRQ != nil || e.SRQNum != 0:
		return fmt.Sprintf("%v SRQ %#x", e.Type, e.SRQNum)
	case e.QPNum != 0:
		return fmt.Sprintf("%v QP %#x", e.Type, e.QPNum)
	}
	return e.Type.String()
}

// ObjectCounts are the numbers of live objects of each kind in this process,
// for leak checks in tests.
type ObjectCounts struct {
	Contexts     int64
	PDs          int64
	MRs          int64
	CQs          int64
	CompChannels int64
	QPs          int64
	SRQs         int64
	XRCDs        int64
	AHs          int64
}

// IsZero reports whether every count is zero.
func (c ObjectCounts) IsZero() bool { return c == ObjectCounts{} }

// live counts this package's objects; objtrace can say where the live ones
// were created.
var live = struct {
	contexts, pds, mrs, cqs, channels, qps, srqs, xrcds, ahs objtrace.Counter
}{
	contexts: objtrace.Counter{Kind: "verbs context"},
	pds:      objtrace.Counter{Kind: "PD"},
	mrs:      objtrace.Counter{Kind: "MR"},
	cqs:      objtrace.Counter{Kind: "CQ"},
	channels: objtrace.Counter{Kind: "completion channel"},
	qps:      objtrace.Counter{Kind: "QP"},
	srqs:     objtrace.Counter{Kind: "SRQ"},
	xrcds:    objtrace.Counter{Kind: "XRC domain"},
	ahs:      objtrace.Counter{Kind: "AH"},
}

// Counts returns the number of live objects of each kind.
//
// The kernel's counts, every process's and its own together, are
// `rdma resource show DEV` (it tracks no AHs, XRC domains or completion
// channels).
func Counts() ObjectCounts {
	return ObjectCounts{
		Contexts:     live.contexts.Load(),
		PDs:          live.pds.Load(),
		MRs:          live.mrs.Load(),
		CQs:          live.cqs.Load(),
		CompChannels: live.channels.Load(),
		QPs:          live.qps.Load(),
		SRQs:         live.srqs.Load(),
		XRCDs:        live.xrcds.Load(),
		AHs:          live.ahs.Load(),
	}
}

// maskNames are the kernel's IB_QP_* names, bit i of a QPAttrMask first.
var maskNames = func() []bitnames.Bit {
	var b []bitnames.Bit
	for i, n := range [...]string{
		"STATE", "CUR_STATE", "EN_SQD_ASYNC_NOTIFY", "ACCESS_FLAGS", "PKEY_INDEX", "PORT",
		"QKEY", "AV", "PATH_MTU", "TIMEOUT", "RETRY_CNT", "RNR_RETRY", "RQ_PSN",
		"MAX_QP_RD_ATOMIC", "ALT_PATH", "MIN_RNR_TIMER", "SQ_PSN", "MAX_DEST_RD_ATOMIC",
		"PATH_MIG_STATE", "CAP", "DEST_QPN",
	} {
		b = append(b, bitnames.Bit{Mask: 1 << i, Name: n})
	}
	return b
}()

// String names the mask's bits as the kernel's IB_QP_* names, such as
// "STATE|PKEY_INDEX|PORT", unknown bits in hex and none as "0".
func (m QPAttrMask) String() string { return bitnames.Join(uint64(m), maskNames) }
