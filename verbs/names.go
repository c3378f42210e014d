package verbs

import (
	"fmt"
	"strings"
)

// Names of the enumerations and flag sets of types.go and api.go that have
// no String method beside their definition: without one a value prints as
// a bare number in errors, logs and %v. Each name is the constant's own
// without the type's prefix (AccessRemoteRead prints as "RemoteRead").

// bitName names one bit of a flag set.
type bitName struct {
	bit  uint64
	name string
}

// maskString joins the names of v's known bits with "|", in bit order,
// with any unknown bits last in hex; 0 prints as "0".
func maskString(v uint64, names []bitName) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for _, n := range names {
		if v&n.bit != 0 {
			parts = append(parts, n.name)
			v &^= n.bit
		}
	}
	if v != 0 {
		parts = append(parts, fmt.Sprintf("%#x", v))
	}
	return strings.Join(parts, "|")
}

var xrcdFlagNames = []bitName{
	{uint64(XRCDCreate), "Create"},
	{uint64(XRCDExclusive), "Exclusive"},
}

// String names the flags, such as "Create|Exclusive"; unknown bits print in
// hex and no flags as "0".
func (f XRCDFlags) String() string { return maskString(uint64(f), xrcdFlagNames) }

var accessNames = []bitName{
	{uint64(AccessLocalWrite), "LocalWrite"},
	{uint64(AccessRemoteWrite), "RemoteWrite"},
	{uint64(AccessRemoteRead), "RemoteRead"},
	{uint64(AccessRemoteAtomic), "RemoteAtomic"},
	{uint64(AccessMWBind), "MWBind"},
	{uint64(AccessZeroBased), "ZeroBased"},
	{uint64(AccessOnDemand), "OnDemand"},
	{uint64(AccessHugeTLB), "HugeTLB"},
	{uint64(AccessRelaxedOrder), "RelaxedOrder"},
}

// String names the access flags, such as "LocalWrite|RemoteRead"; unknown
// bits print in hex and no flags as "0".
func (a Access) String() string { return maskString(uint64(a), accessNames) }

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

var wcFlagNames = []bitName{
	{uint64(WCWithGRH), "WithGRH"},
	{uint64(WCWithImm), "WithImm"},
}

// String names the flags, such as "WithGRH|WithImm"; unknown bits print in
// hex and no flags as "0".
func (f WCFlags) String() string { return maskString(uint64(f), wcFlagNames) }

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

var sendFlagNames = []bitName{
	{uint64(SendFence), "Fence"},
	{uint64(SendSignaled), "Signaled"},
	{uint64(SendSolicited), "Solicited"},
	{uint64(SendInline), "Inline"},
}

// String names the flags, such as "Signaled|Inline"; unknown bits print in
// hex and no flags as "0".
func (f SendFlags) String() string { return maskString(uint64(f), sendFlagNames) }

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

var deviceCapNames = []bitName{
	{uint64(DeviceResizeMaxWR), "ResizeMaxWR"},
	{uint64(DeviceBadPKeyCntr), "BadPKeyCntr"},
	{uint64(DeviceBadQKeyCntr), "BadQKeyCntr"},
	{uint64(DeviceRawMulti), "RawMulti"},
	{uint64(DeviceAutoPathMig), "AutoPathMig"},
	{uint64(DeviceChangePhyPort), "ChangePhyPort"},
	{uint64(DeviceUDAVPortEnforce), "UDAVPortEnforce"},
	{uint64(DeviceCurrQPStateMod), "CurrQPStateMod"},
	{uint64(DeviceShutdownPort), "ShutdownPort"},
	{uint64(DeviceInitType), "InitType"},
	{uint64(DevicePortActiveEvent), "PortActiveEvent"},
	{uint64(DeviceSysImageGUID), "SysImageGUID"},
	{uint64(DeviceRCRNRNAKGen), "RCRNRNAKGen"},
	{uint64(DeviceSRQResize), "SRQResize"},
	{uint64(DeviceNNotifyCQ), "NNotifyCQ"},
	{uint64(DeviceMemWindow), "MemWindow"},
	{uint64(DeviceUDIPCsum), "UDIPCsum"},
	{uint64(DeviceXRC), "XRC"},
	{uint64(DeviceMemMgtExtensions), "MemMgtExtensions"},
	{uint64(DeviceMemWindowType2A), "MemWindowType2A"},
	{uint64(DeviceMemWindowType2B), "MemWindowType2B"},
	{uint64(DeviceRCIPCsum), "RCIPCsum"},
	{uint64(DeviceRawIPCsum), "RawIPCsum"},
	{uint64(DeviceManagedFlowSteering), "ManagedFlowSteering"},
}

// String names the capability bits, such as "SRQResize|XRC"; unknown bits
// print in hex and no bits as "0".
func (c DeviceCap) String() string { return maskString(uint64(c), deviceCapNames) }

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
