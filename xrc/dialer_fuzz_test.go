package xrc

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// FuzzReverseLeg: whatever reverse leg a hostile ACCEPT names (any tag,
// INI, TGT, domain, incarnation, from the sender's node or another), the
// dialer's acceptor either refuses it holding exactly what it held (kernel
// handles, legs, TGT handles), or registers one leg on the named TGT, which
// it verified (an XRC_RECV TGT in RTR/RTS, from that node's named INI, in
// our domain); releasing that leg gives everything back. sel picks the real
// value for each field (bit set) or the fuzzed one, so both paths are fuzzed.
func FuzzReverseLeg(f *testing.F) {
	f.Add(uint8(0xff), uint64(0), uint32(0), uint32(0), uint32(0), uint64(0))
	f.Add(uint8(0xfe), uint64(0), uint32(7), uint32(0), uint32(0), uint64(0))
	f.Add(uint8(0xfd), uint64(0), uint32(0), uint32(0x41), uint32(0), uint64(0))
	f.Add(uint8(0xfb), uint64(0), uint32(0), uint32(0), uint32(0xFFFF00), uint64(0))
	f.Add(uint8(0xf7), uint64(0), uint32(0), uint32(0), uint32(0), uint64(99))
	f.Add(uint8(0x6f), uint64(0xBAD), uint32(0), uint32(0), uint32(0), uint64(0))
	f.Add(uint8(0x1f), uint64(0), uint32(0), uint32(0), uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, sel uint8, inc uint64, tag, ini, tgt uint32, dom uint64) {
		e := newEnv(t)
		_, u := e.phys(e.r1, nil) // the sender's TGT in r2's node, made by r1
		pick := func(bit uint, real, fuzzed uint64) uint64 {
			if sel&(1<<bit) != 0 {
				return real
			}
			return fuzzed
		}
		acc := &wire.Accept{Flags: wire.AcceptReverse, Incarnation: pick(4, senderInc, inc), SRQN: 0x99,
			Rev: wire.Reverse{Tag: uint32(pick(0, 0x5EED, uint64(tag))), INIQPN: uint32(pick(1, uint64(u.iniQPN), uint64(ini))),
				TGTQPN: uint32(pick(2, uint64(u.tgtQPN), uint64(tgt))), DomainID: pick(3, e.dom.ID, dom)}}
		from := addrA
		if sel&(1<<5) == 0 && sel&(1<<6) != 0 {
			from = addrC
		}
		r := e.r2
		handles, legs, dls := r.p.Handles(), r.acc.LocalCounts(), r.acc.Downlinks()
		same := func(what string) {
			if r.p.Handles() != handles || r.acc.LocalCounts() != legs || r.acc.Downlinks() != dls {
				t.Fatalf("%s: %d handles, %d legs, %d TGT handles; was %d, %d, %d", what,
					r.p.Handles(), r.acc.LocalCounts(), r.acc.Downlinks(), handles, legs, dls)
			}
		}
		leg, err := r.acc.ReverseLeg(r.acc.ReserveTag(), 1, acc, from, 30000)
		if err != nil {
			if !errors.Is(err, errReverseGone) && !errors.Is(err, errReverseDomain) && !errors.Is(err, errBadReverse) {
				t.Fatalf("refused with %v", err)
			}
			same("after the refusal")
			return
		}
		got, ok := r.acc.LegTGT(leg)
		if !ok || got != acc.Rev.TGTQPN || acc.Rev.DomainID != e.dom.ID || leg.PeerIncarnation != acc.Incarnation || leg.PeerTag != acc.Rev.Tag {
			t.Fatalf("registered %+v on %#x (%v) for %+v", leg, got, ok, acc)
		}
		info, qerr := r.p.QueryQP(leg.Downlink.qp)
		if qerr != nil || info.Type != verbs.QPTypeXRCRecv || info.DestQPN != acc.Rev.INIQPN || !sameNode(info.Remote, from) ||
			(info.State != verbs.QPStateRTR && info.State != verbs.QPStateRTS) {
			t.Fatalf("registered an unverified TGT: %+v %v", info, qerr)
		}
		if _, err := r.acc.ReverseLeg(r.acc.ReserveTag(), 1, acc, from, 30000); !errors.Is(err, errBadReverse) {
			t.Fatalf("the same leg again: %v, want errBadReverse", err)
		}
		if err := r.acc.Release(leg); err != nil {
			t.Fatal(err)
		}
		same("after the release")
	})
}

// FuzzRejectErr: whatever a REJECTED or UNREACHABLE event carries, rejectErr
// (uplink.go) takes a reason, detail and domain from a valid REJECT only,
// and calls it RejectNoListener only for the CM's own no-listener statuses
// (a peer's REJECT cannot pass for the CM's reasons), and SIDR exactly for a
// SIDR reply's (UNREACHABLE) status. The error is what
// RejectError documents to a caller: for the peer's address; a refusal
// (Status >= 0) matches ECONNREFUSED and says its reason; an unanswered
// request (Status < 0) matches its errno; only -ETIMEDOUT is a Timeout.
func FuzzRejectErr(f *testing.F) {
	good := wire.Reject{Tag: 3, Reason: wire.RejectDomainMismatch, MinVersion: 1, MaxVersion: 2, DomainID: 77}
	b := make([]byte, wire.BudgetREJ)
	good.Encode(b)
	f.Add(true, int32(kernel.RejConsumerDefined), b)
	f.Add(true, int32(kernel.RejInvalidServiceID), make([]byte, wire.BudgetREJ))
	f.Add(false, int32(kernel.SIDRNoListener), []byte(nil))
	f.Add(false, -int32(syscall.ETIMEDOUT), []byte(nil))
	f.Add(false, -int32(syscall.ECONNREFUSED), b)
	f.Fuzz(func(t *testing.T, rej bool, status int32, pd []byte) {
		ev := kernel.Event{Type: kernel.EventUnreachable, Status: int(status), PrivateData: pd}
		if rej {
			ev.Type = kernel.EventRejected
		}
		raddr := netip.MustParseAddrPort("10.0.0.9:7000")
		err := rejectErr(raddr, ev)
		var re *RejectError
		if !errors.As(err, &re) || re.Status != ev.Status || re.Addr != raddr.String() {
			t.Fatalf("%v", err)
		}
		var ne net.Error
		if !errors.As(err, &ne) || ne.Timeout() != (ev.Status == -int(syscall.ETIMEDOUT)) {
			t.Fatalf("%v: Timeout %v for status %d", err, ne != nil && ne.Timeout(), ev.Status)
		}
		if ev.Status > 0 && re.SIDR != !rej { // which CM's status names a positive Status
			t.Fatalf("%+v from a %v event", re, ev.Type)
		}
		if ev.Status >= 0 && (!errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), re.Reason.String())) {
			t.Fatalf("refusal %q (%+v): not ECONNREFUSED, or without its reason", err, re)
		}
		if ev.Status < 0 && (!errors.Is(err, syscall.Errno(-ev.Status)) ||
			errors.Is(err, syscall.ECONNREFUSED) != (ev.Status == -int(syscall.ECONNREFUSED))) {
			t.Fatalf("unanswered request %q: not (only) errno %d", err, -ev.Status)
		}
		var r wire.Reject
		if wire.DecodeReject(pd, &r) == nil {
			if re.Reason != RejectReason(r.Reason) || re.Detail != r.Detail || re.domain != r.DomainID ||
				re.Reason == RejectNoListener || re.Reason == RejectCM {
				t.Fatalf("%+v from %+v", re, r)
			}
			return
		}
		noListener := rej && ev.Status == kernel.RejInvalidServiceID || !rej && ev.Status == kernel.SIDRNoListener
		if re.domain != 0 || re.Detail != 0 || (re.Reason == RejectNoListener) != noListener || !noListener && re.Reason != RejectCM {
			t.Fatalf("%+v from an invalid REJECT %x", re, pd)
		}
	})
}
