package verbs

import (
	"fmt"

	"github.com/goxrc/goxrc/internal/bitnames"
)

// Names of the enumerations and flag sets of types.go and api.go that have
// no String method beside their definition: without one a value prints as
// a bare number in errors, logs and %v. Each name is the constant's own
// without the type's prefix (AccessRemoteRead prints as "RemoteRead").

var xrcdFlagNames = []bitnames.Bit{
	{Mask: uint64(XRCDCreate), Name: "Create"},
	{Mask: uint64(XRCDExclusive), Name: "Exclusive"},
}

// String names the flags, such as "Create|Exclusive"; unknown bits print in
// hex and no flags as "0".
func (f XRCDFlags) String() string { return bitnames.Join(uint64(f), xrcdFlagNames) }

var accessNames = []bitnames.Bit{
	{Mask: uint64(AccessLocalWrite), Name: "LocalWrite"},
	{Mask: uint64(AccessRemoteWrite), Name: "RemoteWrite"},
	{Mask: uint64(AccessRemoteRead), Name: "RemoteRead"},
	{Mask: uint64(AccessRemoteAtomic), Name: "RemoteAtomic"},
	{Mask: uint64(AccessMWBind), Name: "MWBind"},
	{Mask: uint64(AccessZeroBased), Name: "ZeroBased"},
	{Mask: uint64(AccessOnDemand), Name: "OnDemand"},
	{Mask: uint64(AccessHugeTLB), Name: "HugeTLB"},
	{Mask: uint64(AccessRelaxedOrder), Name: "RelaxedOrder"},
}

// String names the access flags, such as "LocalWrite|RemoteRead"; unknown
// bits print in hex and no flags as "0".
func (a Access) String() string { return bitnames.Join(uint64(a), accessNames) }

// String names the opcode, such as "RDMARead", or prints WCOpcode(n) for an
// unknown one.
func (o WCOpcode) String() string {
	switch o {
	case WCSend:
		return "Send"
	case WCRDMAWrite:
		return "RDMAWrite"
	case WCRDMARead:
		return "RDMARead"
	case WCCompSwap:
		return "CompSwap"
	case WCFetchAdd:
		return "FetchAdd"
	case WCRecv:
		return "Recv"
	case WCRecvRDMAWithImm:
		return "RecvRDMAWithImm"
	}
	return fmt.Sprintf("WCOpcode(%d)", uint32(o))
}

var wcFlagNames = []bitnames.Bit{
	{Mask: uint64(WCWithGRH), Name: "WithGRH"},
	{Mask: uint64(WCWithImm), Name: "WithImm"},
}

// String names the flags, such as "WithGRH|WithImm"; unknown bits print in
// hex and no flags as "0".
func (f WCFlags) String() string { return bitnames.Join(uint64(f), wcFlagNames) }

// String names the opcode, such as "SendWithImm", or prints WROpcode(n) for
// an unknown one.
func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMAWrite"
	case WRRDMAWriteWithImm:
		return "RDMAWriteWithImm"
	case WRSend:
		return "Send"
	case WRSendWithImm:
		return "SendWithImm"
	case WRRDMARead:
		return "RDMARead"
	case WRAtomicCmpSwp:
		return "AtomicCmpSwp"
	case WRAtomicFetchAdd:
		return "AtomicFetchAdd"
	}
	return fmt.Sprintf("WROpcode(%d)", uint32(o))
}

var sendFlagNames = []bitnames.Bit{
	{Mask: uint64(SendFence), Name: "Fence"},
	{Mask: uint64(SendSignaled), Name: "Signaled"},
	{Mask: uint64(SendSolicited), Name: "Solicited"},
	{Mask: uint64(SendInline), Name: "Inline"},
}

// String names the flags, such as "Signaled|Inline"; unknown bits print in
// hex and no flags as "0".
func (f SendFlags) String() string { return bitnames.Join(uint64(f), sendFlagNames) }

// String names the link layer, such as "Ethernet", or prints LinkLayer(n)
// for an unknown one.
func (l LinkLayer) String() string {
	switch l {
	case LinkLayerUnspecified:
		return "Unspecified"
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	return fmt.Sprintf("LinkLayer(%d)", uint8(l))
}

var deviceCapNames = []bitnames.Bit{
	{Mask: uint64(DeviceResizeMaxWR), Name: "ResizeMaxWR"},
	{Mask: uint64(DeviceBadPKeyCntr), Name: "BadPKeyCntr"},
	{Mask: uint64(DeviceBadQKeyCntr), Name: "BadQKeyCntr"},
	{Mask: uint64(DeviceRawMulti), Name: "RawMulti"},
	{Mask: uint64(DeviceAutoPathMig), Name: "AutoPathMig"},
	{Mask: uint64(DeviceChangePhyPort), Name: "ChangePhyPort"},
	{Mask: uint64(DeviceUDAVPortEnforce), Name: "UDAVPortEnforce"},
	{Mask: uint64(DeviceCurrQPStateMod), Name: "CurrQPStateMod"},
	{Mask: uint64(DeviceShutdownPort), Name: "ShutdownPort"},
	{Mask: uint64(DeviceInitType), Name: "InitType"},
	{Mask: uint64(DevicePortActiveEvent), Name: "PortActiveEvent"},
	{Mask: uint64(DeviceSysImageGUID), Name: "SysImageGUID"},
	{Mask: uint64(DeviceRCRNRNAKGen), Name: "RCRNRNAKGen"},
	{Mask: uint64(DeviceSRQResize), Name: "SRQResize"},
	{Mask: uint64(DeviceNNotifyCQ), Name: "NNotifyCQ"},
	{Mask: uint64(DeviceMemWindow), Name: "MemWindow"},
	{Mask: uint64(DeviceUDIPCsum), Name: "UDIPCsum"},
	{Mask: uint64(DeviceXRC), Name: "XRC"},
	{Mask: uint64(DeviceMemMgtExtensions), Name: "MemMgtExtensions"},
	{Mask: uint64(DeviceMemWindowType2A), Name: "MemWindowType2A"},
	{Mask: uint64(DeviceMemWindowType2B), Name: "MemWindowType2B"},
	{Mask: uint64(DeviceRCIPCsum), Name: "RCIPCsum"},
	{Mask: uint64(DeviceRawIPCsum), Name: "RawIPCsum"},
	{Mask: uint64(DeviceManagedFlowSteering), Name: "ManagedFlowSteering"},
}

// String names the capability bits, such as "SRQResize|XRC"; unknown bits
// print in hex and no bits as "0".
func (c DeviceCap) String() string { return bitnames.Join(uint64(c), deviceCapNames) }

// String names the atomic capability, such as "HCA", or prints AtomicCap(n)
// for an unknown one.
func (a AtomicCap) String() string {
	switch a {
	case AtomicNone:
		return "None"
	case AtomicHCA:
		return "HCA"
	case AtomicGlob:
		return "Glob"
	}
	return fmt.Sprintf("AtomicCap(%d)", uint8(a))
}

// String names the GID type, such as "RoCEv2", or prints GIDType(n) for an
// unknown one.
func (t GIDType) String() string {
	switch t {
	case GIDTypeIB:
		return "IB"
	case GIDTypeRoCEv1:
		return "RoCEv1"
	case GIDTypeRoCEv2:
		return "RoCEv2"
	}
	return fmt.Sprintf("GIDType(%d)", uint8(t))
}
