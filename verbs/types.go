package verbs

import (
	"fmt"
	"net"
)

// The enumerations below carry libibverbs' numeric values, so the cgo layer
// converts them with a plain cast; they are defined here, without cgo, so that
// every build (stubs included) shares them.

// QPType is a queue pair transport type.
type QPType uint8

const (
	QPTypeRC      QPType = 2  // reliable connected
	QPTypeUC      QPType = 3  // unreliable connected
	QPTypeUD      QPType = 4  // unreliable datagram
	QPTypeXRCSend QPType = 9  // XRC initiator (INI): send only
	QPTypeXRCRecv QPType = 10 // XRC target (TGT): receive only, owned by an XRC domain
)

func (t QPType) String() string {
	switch t {
	case QPTypeRC:
		return "RC"
	case QPTypeUC:
		return "UC"
	case QPTypeUD:
		return "UD"
	case QPTypeXRCSend:
		return "XRC_SEND"
	case QPTypeXRCRecv:
		return "XRC_RECV"
	}
	return fmt.Sprintf("QPType(%d)", uint8(t))
}

// QPState is a queue pair state.
type QPState uint8

// The states, with enum ibv_qp_state's values (IBV_QPS_RESET ...).
const (
	QPStateReset QPState = iota
	QPStateInit
	QPStateRTR
	QPStateRTS
	QPStateSQD
	QPStateSQE
	QPStateErr
	QPStateUnknown
)

func (s QPState) String() string {
	names := [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR", "UNKNOWN"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("QPState(%d)", uint8(s))
}

// MTU is an IB path MTU enumeration value (1 = 256 bytes ... 5 = 4096 bytes).
type MTU uint8

// The path MTUs, with enum ibv_mtu's values (IBV_MTU_256 ...).
const (
	MTU256  MTU = 1
	MTU512  MTU = 2
	MTU1024 MTU = 3
	MTU2048 MTU = 4
	MTU4096 MTU = 5
)

// Bytes returns the MTU in bytes, or 0 for an invalid value.
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// String prints the MTU in bytes ("4096"), as ibv_devinfo's active_mtu does.
func (m MTU) String() string { return fmt.Sprintf("%d", m.Bytes()) }

// Access are memory region and QP access flags.
type Access uint32

// The flags, with enum ibv_access_flags' bits (IBV_ACCESS_LOCAL_WRITE ...).
const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
	AccessMWBind       Access = 1 << 4
	AccessZeroBased    Access = 1 << 5
	AccessOnDemand     Access = 1 << 6
	AccessHugeTLB      Access = 1 << 7
	AccessRelaxedOrder Access = 1 << 20
)

// QPAttrMask selects the fields of QPAttr that Modify applies or Query fills.
type QPAttrMask uint32

// The fields, with enum ibv_qp_attr_mask's bits (IBV_QP_STATE ...).
const (
	QPAttrState            QPAttrMask = 1 << 0
	QPAttrCurState         QPAttrMask = 1 << 1
	QPAttrEnSQDAsyncNotify QPAttrMask = 1 << 2
	QPAttrAccessFlags      QPAttrMask = 1 << 3
	QPAttrPKeyIndex        QPAttrMask = 1 << 4
	QPAttrPort             QPAttrMask = 1 << 5
	QPAttrQKey             QPAttrMask = 1 << 6
	QPAttrAV               QPAttrMask = 1 << 7
	QPAttrPathMTU          QPAttrMask = 1 << 8
	QPAttrTimeout          QPAttrMask = 1 << 9
	QPAttrRetryCnt         QPAttrMask = 1 << 10
	QPAttrRNRRetry         QPAttrMask = 1 << 11
	QPAttrRQPSN            QPAttrMask = 1 << 12
	QPAttrMaxQPRdAtomic    QPAttrMask = 1 << 13
	QPAttrAltPath          QPAttrMask = 1 << 14
	QPAttrMinRNRTimer      QPAttrMask = 1 << 15
	QPAttrSQPSN            QPAttrMask = 1 << 16
	QPAttrMaxDestRdAtomic  QPAttrMask = 1 << 17
	QPAttrPathMigState     QPAttrMask = 1 << 18
	QPAttrCap              QPAttrMask = 1 << 19
	QPAttrDestQPN          QPAttrMask = 1 << 20
)

// GID is a 128-bit global identifier; on RoCE it holds an IPv6 or an
// IPv4-mapped address.
type GID [16]byte

// IP returns the GID as an IP address (IPv4-mapped GIDs print as IPv4).
func (g GID) IP() net.IP { return net.IP(g[:]) }

// String prints the GID as net.IP prints it: an IPv6 address, or the IPv4
// address of an IPv4-mapped GID (RoCE v2 over IPv4), where ibv_devinfo -v
// prints ::ffff:a.b.c.d.
func (g GID) String() string { return g.IP().String() }

// IsZero reports whether the GID is unset.
func (g GID) IsZero() bool { return g == GID{} }

// GlobalRoute is the GRH part of an address vector.
type GlobalRoute struct {
	DGID         GID
	FlowLabel    uint32
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
}

// AHAttr is an address vector: where a QP or an address handle sends to.
type AHAttr struct {
	GRH         GlobalRoute
	DLID        uint16
	SL          uint8
	SrcPathBits uint8
	StaticRate  uint8
	IsGlobal    bool
	PortNum     uint8
}

// QPCap are a QP's queue sizes.
type QPCap struct {
	MaxSendWR     uint32
	MaxRecvWR     uint32
	MaxSendSGE    uint32
	MaxRecvSGE    uint32
	MaxInlineData uint32
}

// QPAttr mirrors struct ibv_qp_attr. Which fields count is chosen by a
// QPAttrMask.
type QPAttr struct {
	State            QPState
	CurState         QPState
	PathMTU          MTU
	PathMigState     uint8
	QKey             uint32
	RQPSN            uint32
	SQPSN            uint32
	DestQPNum        uint32
	AccessFlags      Access
	Cap              QPCap
	AH               AHAttr
	AltAH            AHAttr
	PKeyIndex        uint16
	AltPKeyIndex     uint16
	EnSQDAsyncNotify bool
	SQDraining       bool
	MaxQPRdAtomic    uint8
	MaxDestRdAtomic  uint8
	MinRNRTimer      uint8
	PortNum          uint8
	Timeout          uint8
	RetryCnt         uint8
	RNRRetry         uint8
	AltPortNum       uint8
	AltTimeout       uint8
}

// WCStatus is a work completion status.
type WCStatus uint32

// The statuses, with enum ibv_wc_status's values (IBV_WC_SUCCESS ...).
const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRdReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "work request flushed", "memory window bind error", "bad response",
	"local access error", "remote invalid request", "remote access error", "remote operation error",
	"transport retry counter exceeded", "RNR retry counter exceeded", "local RDD violation",
	"remote invalid RD request", "remote aborted", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout", "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("WCStatus(%d)", uint32(s))
}

// WCOpcode says what a completed work request was.
type WCOpcode uint32

// The opcodes, with enum ibv_wc_opcode's values (IBV_WC_SEND ...).
const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 128
	WCRecvRDMAWithImm WCOpcode = 129
)

// WCFlags are work completion flags.
type WCFlags uint32

// The flags, with enum ibv_wc_flags' bits (IBV_WC_GRH, IBV_WC_WITH_IMM).
const (
	WCWithGRH WCFlags = 1 << 0
	WCWithImm WCFlags = 1 << 1
)

// WorkCompletion is one polled completion, copied out of C memory.
type WorkCompletion struct {
	WRID      uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32 // host byte order; valid with WCWithImm
	QPNum     uint32 // the local QP (for XRC and SRQ receives: which TGT/QP)
	SrcQP     uint32
	Flags     WCFlags
	SLID      uint16
	SL        uint8
}

// Err returns nil for a successful completion and a *CompletionError otherwise.
func (wc *WorkCompletion) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &CompletionError{WRID: wc.WRID, Status: wc.Status, VendorErr: wc.VendorErr, QPNum: wc.QPNum}
}

// WROpcode is a send work request opcode.
type WROpcode uint32

// The opcodes, with enum ibv_wr_opcode's values (IBV_WR_RDMA_WRITE ...).
const (
	WRRDMAWrite        WROpcode = 0
	WRRDMAWriteWithImm WROpcode = 1
	WRSend             WROpcode = 2
	WRSendWithImm      WROpcode = 3
	WRRDMARead         WROpcode = 4
	WRAtomicCmpSwp     WROpcode = 5
	WRAtomicFetchAdd   WROpcode = 6
)

// SendFlags modify a send work request.
type SendFlags uint32

// The flags, with enum ibv_send_flags' bits (IBV_SEND_FENCE ...).
const (
	SendFence     SendFlags = 1 << 0
	SendSignaled  SendFlags = 1 << 1
	SendSolicited SendFlags = 1 << 2
	SendInline    SendFlags = 1 << 3
)

// PortState is the logical state of a port.
type PortState uint8

// The states, with enum ibv_port_state's values (IBV_PORT_NOP ...).
const (
	PortNOP PortState = iota
	PortDown
	PortInit
	PortArmed
	PortActive
	PortActiveDefer
)

func (s PortState) String() string {
	names := [...]string{"NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER"}
	if int(s) < len(names) {
		return names[s]
	}
	return fmt.Sprintf("PortState(%d)", uint8(s))
}

// LinkLayer is a port's link layer.
type LinkLayer uint8

// The link layers, with IBV_LINK_LAYER_*'s values.
const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

// DeviceCap are device capability flags (ibv_device_attr.device_cap_flags):
// each constant is the ibv_device_cap_flags bit of the same name in
// <infiniband/verbs.h> (DeviceXRC is IBV_DEVICE_XRC, DeviceNNotifyCQ
// IBV_DEVICE_N_NOTIFY_CQ).
type DeviceCap uint64

// The capability bits (TestDeviceCapsMatchVerbsH checks each against <infiniband/verbs.h>).
const (
	DeviceResizeMaxWR         DeviceCap = 1 << 0
	DeviceBadPKeyCntr         DeviceCap = 1 << 1
	DeviceBadQKeyCntr         DeviceCap = 1 << 2
	DeviceRawMulti            DeviceCap = 1 << 3
	DeviceAutoPathMig         DeviceCap = 1 << 4
	DeviceChangePhyPort       DeviceCap = 1 << 5
	DeviceUDAVPortEnforce     DeviceCap = 1 << 6
	DeviceCurrQPStateMod      DeviceCap = 1 << 7
	DeviceShutdownPort        DeviceCap = 1 << 8
	DeviceInitType            DeviceCap = 1 << 9
	DevicePortActiveEvent     DeviceCap = 1 << 10
	DeviceSysImageGUID        DeviceCap = 1 << 11
	DeviceRCRNRNAKGen         DeviceCap = 1 << 12
	DeviceSRQResize           DeviceCap = 1 << 13
	DeviceNNotifyCQ           DeviceCap = 1 << 14
	DeviceMemWindow           DeviceCap = 1 << 17
	DeviceUDIPCsum            DeviceCap = 1 << 18
	DeviceXRC                 DeviceCap = 1 << 20 // IBV_DEVICE_XRC: XRC domains, SRQs and QPs
	DeviceMemMgtExtensions    DeviceCap = 1 << 21
	DeviceMemWindowType2A     DeviceCap = 1 << 23
	DeviceMemWindowType2B     DeviceCap = 1 << 24
	DeviceRCIPCsum            DeviceCap = 1 << 25
	DeviceRawIPCsum           DeviceCap = 1 << 26
	DeviceManagedFlowSteering DeviceCap = 1 << 29
)

// AtomicCap says whether and how a device performs atomics.
type AtomicCap uint8

const (
	AtomicNone AtomicCap = 0 // no atomics
	AtomicHCA  AtomicCap = 1 // atomic within this device
	AtomicGlob AtomicCap = 2 // atomic with respect to the host too
)

// GIDType is the RoCE flavour of a GID table entry.
type GIDType uint8

// The GID types, with enum ibv_gid_type's values (IBV_GID_TYPE_IB ...).
const (
	GIDTypeIB     GIDType = 0
	GIDTypeRoCEv1 GIDType = 1
	GIDTypeRoCEv2 GIDType = 2
)

// DeviceAttr is what QueryDevice reports.
type DeviceAttr struct {
	FWVersion       string
	NodeGUID        uint64
	SysImageGUID    uint64
	MaxMRSize       uint64
	PageSizeCap     uint64
	VendorID        uint32
	VendorPartID    uint32
	HWVersion       uint32
	MaxQP           int
	MaxQPWR         int
	CapFlags        DeviceCap
	MaxSGE          int
	MaxSGERd        int
	MaxCQ           int
	MaxCQE          int
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int
	MaxQPInitRdAtom int
	MaxSRQ          int
	MaxSRQWR        int
	MaxSRQSGE       int
	AtomicCap       AtomicCap
	PhysPortCnt     int
}

// XRC reports whether the device advertises XRC (IBV_DEVICE_XRC).
//
// `ibv_devinfo -d DEV -v` shows the same bit: XRC under device_cap_flags.
func (a *DeviceAttr) XRC() bool { return a.CapFlags&DeviceXRC != 0 }

// PortAttr is what QueryPort reports.
type PortAttr struct {
	State        PortState
	MaxMTU       MTU
	ActiveMTU    MTU
	GIDTableLen  int
	PKeyTableLen int
	MaxMsgSize   uint32
	LID          uint16
	SMLID        uint16
	LinkLayer    LinkLayer
	ActiveSpeed  uint8
	ActiveWidth  uint8
}

// GIDEntry is one entry of a port's GID table.
type GIDEntry struct {
	Index  int
	GID    GID
	Type   GIDType
	Netdev string // the network device behind a RoCE GID, if any
}
