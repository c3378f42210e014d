package verbs

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// A refused opcode names itself in PostSend's error: the message printed
// the opcode as a bare number ("opcode 4 is not valid on this QP type").
func TestCheckOpcodeErrorNamesTheOpcode(t *testing.T) {
	err := checkOpcode(QPTypeUD, WRRDMARead)
	if err == nil || !strings.Contains(err.Error(), "RDMARead") {
		t.Fatalf("checkOpcode(UD, WRRDMARead) = %v, want an error naming RDMARead", err)
	}
	err = checkOpcode(QPTypeRC, WROpcode(9))
	if err == nil || !strings.Contains(err.Error(), "WROpcode(9)") {
		t.Fatalf("checkOpcode(RC, 9) = %v, want an error naming WROpcode(9)", err)
	}
}

func TestEnumAndFlagNames(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{XRCDCreate, "Create"},
		{XRCDExclusive, "Exclusive"},
		{XRCDCreate | XRCDExclusive, "Create|Exclusive"},
		{XRCDFlags(0), "0"},
		{XRCDFlags(1<<5 | 1), "Create|0x20"},

		{AccessLocalWrite, "LocalWrite"},
		{AccessRemoteWrite, "RemoteWrite"},
		{AccessRemoteRead, "RemoteRead"},
		{AccessRemoteAtomic, "RemoteAtomic"},
		{AccessMWBind, "MWBind"},
		{AccessZeroBased, "ZeroBased"},
		{AccessOnDemand, "OnDemand"},
		{AccessHugeTLB, "HugeTLB"},
		{AccessRelaxedOrder, "RelaxedOrder"},
		{AccessRemoteRead | AccessRemoteWrite, "RemoteWrite|RemoteRead"},
		{Access(0), "0"},
		{AccessLocalWrite | 1<<8, "LocalWrite|0x100"},

		{WCSend, "Send"},
		{WCRDMAWrite, "RDMAWrite"},
		{WCRDMARead, "RDMARead"},
		{WCCompSwap, "CompSwap"},
		{WCFetchAdd, "FetchAdd"},
		{WCRecv, "Recv"},
		{WCRecvRDMAWithImm, "RecvRDMAWithImm"},
		{WCOpcode(7), "WCOpcode(7)"},

		{WCWithGRH, "WithGRH"},
		{WCWithImm, "WithImm"},
		{WCWithGRH | WCWithImm, "WithGRH|WithImm"},
		{WCFlags(0), "0"},
		{WCFlags(1 << 4), "0x10"},

		{WRRDMAWrite, "RDMAWrite"},
		{WRRDMAWriteWithImm, "RDMAWriteWithImm"},
		{WRSend, "Send"},
		{WRSendWithImm, "SendWithImm"},
		{WRRDMARead, "RDMARead"},
		{WRAtomicCmpSwp, "AtomicCmpSwp"},
		{WRAtomicFetchAdd, "AtomicFetchAdd"},
		{WROpcode(12), "WROpcode(12)"},

		{SendFence, "Fence"},
		{SendSignaled, "Signaled"},
		{SendSolicited, "Solicited"},
		{SendInline, "Inline"},
		{SendSignaled | SendInline, "Signaled|Inline"},
		{SendFlags(0), "0"},
		{SendFlags(1<<6 | 2), "Signaled|0x40"},

		{LinkLayerUnspecified, "Unspecified"},
		{LinkLayerInfiniBand, "InfiniBand"},
		{LinkLayerEthernet, "Ethernet"},
		{LinkLayer(3), "LinkLayer(3)"},

		{DeviceResizeMaxWR, "ResizeMaxWR"},
		{DeviceBadPKeyCntr, "BadPKeyCntr"},
		{DeviceBadQKeyCntr, "BadQKeyCntr"},
		{DeviceRawMulti, "RawMulti"},
		{DeviceAutoPathMig, "AutoPathMig"},
		{DeviceChangePhyPort, "ChangePhyPort"},
		{DeviceUDAVPortEnforce, "UDAVPortEnforce"},
		{DeviceCurrQPStateMod, "CurrQPStateMod"},
		{DeviceShutdownPort, "ShutdownPort"},
		{DeviceInitType, "InitType"},
		{DevicePortActiveEvent, "PortActiveEvent"},
		{DeviceSysImageGUID, "SysImageGUID"},
		{DeviceRCRNRNAKGen, "RCRNRNAKGen"},
		{DeviceSRQResize, "SRQResize"},
		{DeviceNNotifyCQ, "NNotifyCQ"},
		{DeviceMemWindow, "MemWindow"},
		{DeviceUDIPCsum, "UDIPCsum"},
		{DeviceXRC, "XRC"},
		{DeviceMemMgtExtensions, "MemMgtExtensions"},
		{DeviceMemWindowType2A, "MemWindowType2A"},
		{DeviceMemWindowType2B, "MemWindowType2B"},
		{DeviceRCIPCsum, "RCIPCsum"},
		{DeviceRawIPCsum, "RawIPCsum"},
		{DeviceManagedFlowSteering, "ManagedFlowSteering"},
		{DeviceSRQResize | DeviceXRC, "SRQResize|XRC"},
		{DeviceCap(0), "0"},
		{DeviceXRC | 1<<40, "XRC|0x10000000000"},

		{AtomicNone, "None"},
		{AtomicHCA, "HCA"},
		{AtomicGlob, "Glob"},
		{AtomicCap(3), "AtomicCap(3)"},

		{GIDTypeIB, "IB"},
		{GIDTypeRoCEv1, "RoCEv1"},
		{GIDTypeRoCEv2, "RoCEv2"},
		{GIDType(4), "GIDType(4)"},
	} {
		if got := fmt.Sprint(c.v); got != c.want {
			t.Errorf("%T prints %q, want %q", c.v, got, c.want)
		}
	}
}

// A WorkCompletion's %+v, as a log line shows it, names its opcode and flags.
func TestWorkCompletionPrintsNames(t *testing.T) {
	wc := WorkCompletion{Opcode: WCRecvRDMAWithImm, Flags: WCWithImm}
	got := fmt.Sprintf("%+v", wc)
	if !strings.Contains(got, "Opcode:RecvRDMAWithImm") || !strings.Contains(got, "Flags:WithImm") {
		t.Fatalf("%%+v of a completion = %s, want its opcode and flags named", got)
	}
}

// MTU and GID print as their docs say: an MTU in bytes (the enum holds 1
// to 5), a GID as net.IP prints it, an IPv4-mapped one as its IPv4 address.
func TestMTUAndGIDStrings(t *testing.T) {
	if got := MTU1024.String(); got != "1024" {
		t.Errorf("MTU1024 = %q, want 1024", got)
	}
	for in, want := range map[string]string{"10.0.0.1": "10.0.0.1", "fe80::1": "fe80::1"} {
		var g GID
		copy(g[:], net.ParseIP(in).To16())
		if got := g.String(); got != want {
			t.Errorf("GID of %s = %q, want %q", in, got, want)
		}
	}
}
