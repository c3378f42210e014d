package xrc

import (
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// FuzzEndpointRequest sends an endpoint that holds a sender's TGT any
// connection request a stranger can make up: any private data, on the
// physical (XRC-typed) or the virtual (SIDR) exchange, from a process with
// an INI of its own. Whatever it is, the endpoint answers (an accept or a
// reject: nothing hangs or panics), and once the stranger has gone, and a
// half-made connection has met the handshake timeout, it holds what it held
// before: no TGT handle, local count, downlink, connection or QP more, no
// goroutine more (newWorld checks), and its honest connection still works.
// With linger, the stranger stays after destroying its id (the endpoint
// must let go on its own); with fixINI, pd gets the stranger's real INI QP
// number where a REQ has it (unknown to the seeds), so that requests can be
// accepted too.
// The answer itself is checked where the protocol fixes it from the
// request alone (strangerAnswer): private data that is no well-formed
// request of the exchange's type is refused VERSION or BAD_REQUEST, never
// taken; a well-formed one is refused or taken as docs/xrc-protocol.md's
// decision table says for a stranger, whose incarnation and domain hint
// are not the endpoint's to know.
// TestEndpointHostileRequests checks the reasons of requests a stranger
// cannot make up (naming the endpoint's domain, or a TGT it holds).
func FuzzEndpointRequest(f *testing.F) {
	virt := wire.Req{Type: wire.TypeVirtReq, ConnTag: 77, Incarnation: 0xE71, INIQPN: 0x40, TGTQPNHint: 0x40, DomainHint: 2, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
	phys := wire.Req{Type: wire.TypePhysReq, ConnTag: 78, Incarnation: 0xE71, INIQPN: 0x40, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
	enc := func(r wire.Req, f func(*wire.Req)) []byte {
		f(&r)
		b := make([]byte, wire.BudgetSIDRREQ)
		n, err := r.Encode(b)
		if err != nil {
			panic(err)
		}
		return b[:n]
	}
	same := func(*wire.Req) {}
	f.Add(true, true, false, []byte(nil))
	f.Add(true, true, false, []byte("\x13\x37 not our private data"))
	f.Add(true, true, false, enc(virt, same))
	f.Add(true, true, false, enc(virt, same)[:30])
	f.Add(true, true, false, enc(virt, func(r *wire.Req) { r.TGTQPNHint, r.DomainHint = 0x41, 3 }))
	f.Add(true, true, false, enc(virt, func(r *wire.Req) { r.Flags, r.Move = wire.FlagMove, 1 }))
	f.Add(true, true, false, enc(phys, same))
	f.Add(true, false, false, enc(virt, func(r *wire.Req) { // an ABORT naming no dial of ours
		r.Flags, r.PeerTag, r.INIQPN, r.TGTQPNHint, r.DomainHint = wire.FlagReciprocal|wire.FlagAbort, 4242, 0, 0, 0
	}))
	f.Add(false, true, false, enc(phys, same))
	f.Add(false, true, false, enc(phys, func(r *wire.Req) { r.Flags, r.PeerTag = wire.FlagReciprocal, 4242 }))
	f.Add(false, true, false, enc(virt, same))
	f.Add(false, true, false, []byte{wire.Version})
	f.Add(false, false, false, enc(phys, same))
	f.Add(false, true, true, enc(phys, same)) // accepted; the RTU never comes
	f.Add(true, true, true, enc(virt, same))
	next := enc(virt, same)
	next[2]++ // a peer of the next version: VERSION
	f.Add(true, false, false, next)
	f.Add(false, true, false, enc(phys, func(r *wire.Req) { r.Flags, r.TGTQPNHint = wire.FlagReplacesTGT, 0x41 })) // accepted
	f.Add(false, true, false, enc(phys, func(r *wire.Req) { r.Flags, r.Move = wire.FlagMove, 1 }))                 // a MOVE of no leg of ours
	const handshake = 300 * time.Millisecond
	short := func(c *Config) { c.HandshakeTimeout = handshake }
	f.Fuzz(func(t *testing.T, sidr, fixINI, linger bool, pd []byte) {
		ex, budget := kernel.ExchangeXRC, wire.BudgetREQ
		if sidr {
			ex, budget = kernel.ExchangeSIDR, wire.BudgetSIDRREQ
		}
		if len(pd) > budget {
			t.Skip("over the carrier's budget: the kernel refuses it (TestEndpointHostileRequests)")
		}
		w := newWorld(t)
		s := w.endpoint("10.0.9.1", 7000, short)
		r := w.endpoint("10.0.9.2", 7001, short)
		sc, rc := pair(t, s, r)
		stranger := w.rawKernel("10.0.9.3")
		_, iniQPN, err := stranger.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		if fixINI && len(pd) >= 27 {
			pd = append([]byte(nil), pd...)
			pd[24], pd[25], pd[26] = byte(iniQPN>>16), byte(iniQPN>>8), byte(iniQPN) // the REQ's INI QPN
		}
		nodeR := w.f.Node("10.0.9.2")
		snapshot := func() string {
			st := r.Stats()
			st.Rejected, st.Dropped, st.VirtReqs = 0, 0, 0
			return fmt.Sprintf("%+v node %+v", st, nodeR.Stats())
		}
		before := snapshot()
		ev := answer(t, stranger, r.Addr(), ex, iniQPN, pd) // destroys its id
		t.Logf("answered: %v, status %d", ev.Type, ev.Status)
		checkStrangerAnswer(t, ev, sidr, pd, iniQPN, r.dom.ID)
		stranger.Close() // and goes, INI and all
		eventuallyWithin(t, handshake+3*time.Second, "the endpoint holds what it held", func() (bool, string) {
			got := snapshot()
			return got == before, got + "\nwas\n" + before
		})
		roundTrip(t, sc, rc, []byte("unaffected"))
		roundTrip(t, rc, sc, []byte("unaffected"))
	})
}

// The REQ layout of docs/xrc-protocol.md ("Private data, version 4") and
// internal/wire's package documentation, read here by hand: wire's decoder
// is the acceptor's input check under test, so it cannot be the oracle.
const (
	docMagic    = 0x5852
	docVersion  = 4
	docPhysReq  = 1 // on the XRC-typed exchange
	docVirtReq  = 2 // on SIDR
	docReqFixed = 54

	docBudgetXRC, docBudgetSIDR = 56, 180 // a REQ's, a SIDR REQ's private data

	docReciprocal, docReplacesTGT, docMove, docOneExchange, docAbort = 1, 2, 4, 8, 16

	docMinMessage, docMaxMessage = 64, 1 << 20
)

// docReq is a well-formed REQ's fields, as far as the oracle needs them.
type docReq struct {
	flags           byte
	connTag, iniQPN uint32
	domainHint      uint64
}

// readDocReq reads pd as the listener gets it (zero-padded to the
// carrier's budget) by the documented rules: ok is false, with the reason
// the protocol answers that with, when it is no well-formed request of
// the exchange's type.
func readDocReq(pd []byte, sidr bool) (q docReq, reason wire.RejectReason, ok bool) {
	typ, allowed := byte(docPhysReq), byte(docReciprocal|docReplacesTGT|docMove)
	if sidr {
		typ, allowed = docVirtReq, docReciprocal|docMove|docOneExchange|docAbort
	}
	b := padREQ(pd, sidr)
	budget := len(b)
	u24 := func(o int) uint32 { return uint32(b[o])<<16 | uint32(b[o+1])<<8 | uint32(b[o+2]) }
	be16, be32, be64 := binary.BigEndian.Uint16, binary.BigEndian.Uint32, binary.BigEndian.Uint64
	if be16(b[0:]) != docMagic {
		return q, wire.RejectBadRequest, false // not our private data
	}
	if b[2] != docVersion {
		return q, wire.RejectVersion, false // a peer of another version gets VERSION, whatever follows
	}
	flags, length := b[4], int(be16(b[6:]))
	if b[3] != typ || b[5] != 0 || length < docReqFixed || length > budget || length != docReqFixed+int(b[53]) {
		return q, wire.RejectBadRequest, false
	}
	for _, c := range b[length:] {
		if c != 0 {
			return q, wire.RejectBadRequest, false // the kernel pads with zeros only
		}
	}
	q = docReq{flags: flags, connTag: be32(b[8:]), iniQPN: u24(24), domainHint: be64(b[30:])}
	peerTag, inc, hint := be32(b[12:]), be64(b[16:]), u24(27)
	replyPort, credits, maxMsg, move := be16(b[41:]), be16(b[43:]), be32(b[45:]), be32(b[49:])
	has := func(f byte) bool { return flags&f != 0 }
	abort := has(docAbort)
	good := flags&^allowed == 0 &&
		!(has(docReciprocal) && has(docOneExchange)) &&
		(has(docReciprocal) || has(docOneExchange)) == (peerTag != 0) &&
		!(has(docOneExchange) && has(docMove)) &&
		has(docMove) == (move != 0) &&
		(!abort || flags == docReciprocal|docAbort && q.iniQPN == 0 && hint == 0 && q.domainHint == 0) &&
		(abort || q.iniQPN >= 2) &&
		q.connTag != 0 && inc != 0 && replyPort != 0 && credits != 0 &&
		maxMsg >= docMinMessage && maxMsg <= docMaxMessage
	switch {
	case abort:
	case sidr: // VIRT needs a hint and a domain
		good = good && hint >= 2 && q.domainHint != 0
	case has(docReplacesTGT):
		good = good && hint >= 2
	default: // a PHYS_REQ's hint is 0 without REPLACES_TGT
		good = good && hint == 0
	}
	if !good {
		return q, wire.RejectBadRequest, false
	}
	return q, 0, true
}

// strangerAnswer is the answer docs/xrc-protocol.md's decision table fixes
// for a request from a process of a node the endpoint has no leg, dial
// or uplink with, on an endpoint that accepts (not closing, no Admit, its
// backlog empty): with accept false, the REJECT's reason and tag (the
// REQ's conn tag, 0 for one that did not decode). iniQPN is the
// stranger's INI as its CM's REQ carries it, domain the endpoint's.
func strangerAnswer(pd []byte, sidr bool, iniQPN uint32, domain uint64) (accept bool, reason wire.RejectReason, tag uint32) {
	q, reason, ok := readDocReq(pd, sidr)
	if !ok {
		return false, reason, 0
	}
	switch {
	case q.flags&docAbort != 0: // refused as any request the endpoint makes nothing of
		return false, wire.RejectBadRequest, q.connTag
	case !sidr && q.iniQPN != iniQPN: // the INI QPN differs from the CM's
		return false, wire.RejectBadRequest, q.connTag
	case q.flags&docMove != 0: // of a leg it cannot hold, and no dial of ours awaits an ACCEPT from there
		return false, wire.RejectBadRequest, q.connTag
	case sidr && q.domainHint != domain:
		return false, wire.RejectDomainMismatch, q.connTag
	case sidr: // no TGT here has the stranger's INI at the other end
		return false, wire.RejectTGTGone, q.connTag
	case q.flags&docReciprocal != 0: // names no pending dial of ours
		return false, wire.RejectBadRequest, q.connTag
	}
	return true, 0, q.connTag // a new leg: a TGT of its own, ACCEPT
}

// checkStrangerAnswer fails t unless ev, the stranger's answer to pd, is
// the one strangerAnswer fixes. A request that the documented layout and
// wire.DecodeReq, the acceptor's input check, read differently is named
// as such too: the doc and the decoder disagree.
func checkStrangerAnswer(t *testing.T, ev kernel.Event, sidr bool, pd []byte, iniQPN uint32, domain uint64) {
	t.Helper()
	accept, reason, tag := strangerAnswer(pd, sidr, iniQPN, domain)
	if _, _, ok := readDocReq(pd, sidr); ok != (wire.DecodeReq(padREQ(pd, sidr), reqType(sidr), new(wire.Req)) == nil) {
		t.Errorf("%x: well-formed by the documented layout %v, by wire.DecodeReq %v", pd, ok, !ok)
	}
	if accept {
		var acc wire.Accept
		if ev.Type != kernel.EventConnectResponse {
			t.Fatalf("%x: answered %v (status %d), want accepted", pd, ev.Type, ev.Status)
		} else if err := wire.DecodeAccept(ev.PrivateData, &acc); err != nil || acc.TagEcho != tag {
			t.Fatalf("%x: ACCEPT %+v (%v), want one echoing tag %#x", pd, acc, err, tag)
		}
		return
	}
	wantEv, wantSt := kernel.EventRejected, kernel.RejConsumerDefined
	if sidr {
		wantEv, wantSt = kernel.EventUnreachable, kernel.SIDRRejected
	}
	var rej wire.Reject
	if ev.Type != wantEv || ev.Status != wantSt {
		t.Fatalf("%x: answered %v (status %d), want rejected %v", pd, ev.Type, ev.Status, reason)
	} else if err := wire.DecodeReject(ev.PrivateData, &rej); err != nil {
		t.Fatalf("%x: REJECT: %v", pd, err)
	}
	if rej.Reason != reason || rej.Tag != tag || rej.MinVersion != docVersion || rej.MaxVersion != docVersion {
		t.Fatalf("%x: REJECT %v tag %#x versions %d..%d, want %v tag %#x versions %d..%d",
			pd, rej.Reason, rej.Tag, rej.MinVersion, rej.MaxVersion, reason, tag, docVersion, docVersion)
	}
	if (reason == wire.RejectDomainMismatch || reason == wire.RejectTGTGone) && rej.DomainID != domain {
		t.Fatalf("%x: %v carries domain %#x, want ours, %#x", pd, reason, rej.DomainID, domain)
	}
}

// padREQ is pd as the kernel delivers it to the listener of its exchange.
func padREQ(pd []byte, sidr bool) []byte {
	b := make([]byte, docBudgetXRC)
	if sidr {
		b = make([]byte, docBudgetSIDR)
	}
	copy(b, pd)
	return b
}

func reqType(sidr bool) wire.Type {
	if sidr {
		return wire.TypeVirtReq
	}
	return wire.TypePhysReq
}
