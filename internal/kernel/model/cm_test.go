package model

import (
	"bytes"
	"net/netip"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

func allZero(b []byte) bool { return bytes.Count(b, []byte{0}) == len(b) }

// Rule: a second live connected-mode REQ reusing a live INI QPN to the same
// node is REJECTED 10, the first connection gets a DREQ, the listener sees
// nothing.
func TestModelStaleConnRejectsAndDREQsFirst(t *testing.T) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeRC} {
		_, a, b := twoNodes(t, ReuseNever)
		pa, pb := a.NewProcess(), b.NewProcess()
		l := listen(t, pb, ex)
		c1 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), ex, 0x123456, nil))
		s1 := event(t, pb, l, kernel.EventConnectRequest).ID
		ok(t, pb.Accept(s1, 0x654321, nil))
		event(t, pa, c1, kernel.EventConnectResponse)
		ok(t, pa.Establish(c1))
		event(t, pb, s1, kernel.EventEstablished)

		c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), ex, 0x123456, nil))
		e := event(t, pa, c2, kernel.EventRejected)
		if e.Status != kernel.RejStaleConn || len(e.PrivateData) != 148 || !allZero(e.PrivateData) {
			t.Fatalf("%v: %+v", ex, e)
		}
		noEvent(t, pb, l)
		event(t, pa, c1, kernel.EventDisconnected) // the kernel's DREQ from s1
		ok(t, pa.Disconnect(c1))                   // our DREP
		event(t, pa, c1, kernel.EventTimewaitExit)
		event(t, pb, s1, kernel.EventDisconnected)
		event(t, pb, s1, kernel.EventTimewaitExit)
		// Reusable right after the disconnect.
		c3 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), ex, 0x123456, nil))
		event(t, pb, l, kernel.EventConnectRequest)
		_ = c3
	}
}

// Rule: the REP's QPN is checked on the active node: a live connection to
// the same remote QPN (here: an INI whose TGT-typed peer id was destroyed
// silently, and a new TGT with the reused number) rejects the new passive id
// with 10, tears the old connection down, and the REQ is retransmitted.
// A stale REQ whose first connection is still pending: REJ(10) to the new
// one, and the first is untouched (ib_send_cm_dreq refuses an id that is
// not established), so it can still be accepted.
func TestModelStaleConnWhileFirstPending(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	c1 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
	s1 := event(t, pb, l, kernel.EventConnectRequest).ID
	c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
	if e := event(t, pa, c2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatalf("second REQ: %+v, want REJ(stale)", e)
	}
	ok(t, pb.Accept(s1, 0x654321, nil))
	event(t, pa, c1, kernel.EventConnectResponse)
	ok(t, pa.Establish(c1))
	event(t, pb, s1, kernel.EventEstablished)
}

// The stale check comes before the listener lookup (cm_match_req): a REQ
// reusing a live (node, QPN) to a port nobody listens on is REJ(10), not
// REJ(8), and the live connection gets its DREQ.
func TestModelStaleCheckBeforeListener(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	c1 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
	s1 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s1, 0x654321, nil))
	event(t, pa, c1, kernel.EventConnectResponse)
	ok(t, pa.Establish(c1))
	event(t, pb, s1, kernel.EventEstablished)
	nobody := netip.AddrPortFrom(addrB, port+1)
	c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), nobody, kernel.ExchangeXRC, 0x123456, nil))
	if e := event(t, pa, c2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatalf("REQ reusing a live QPN to an unlistened port: %+v, want REJ(stale)", e)
	}
	event(t, pa, c1, kernel.EventDisconnected)
}

func TestModelStaleConnAtREP(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k1 := physLink(t, sa, sb, l)
	ok(t, sb.p.DestroyID(k1.pid)) // XRC_RECV id: no DREQ
	ok(t, sb.p.DestroyQP(k1.tgt))
	noEvent(t, sa.p, k1.aid) // the INI side still thinks it is established

	ini2, iniQPN2, _ := sa.p.CreateINI()
	_ = ini2
	aid2 := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, iniQPN2, nil))
	pid2 := event(t, sb.p, l, kernel.EventConnectRequest).ID
	tgt2, tgtQPN2, _ := sb.p.CreateTGT(sb.d)
	if tgtQPN2 != k1.tgtQPN {
		t.Fatalf("setup: TGT number not reused")
	}
	ok(t, sb.p.TransitionQP(tgt2, verbs.QPStateRTR, pid2))
	ok(t, sb.p.Accept(pid2, tgtQPN2, nil))
	if e := event(t, sb.p, pid2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatalf("passive: %+v", e)
	}
	event(t, sa.p, k1.aid, kernel.EventDisconnected) // DREQ to a gone peer: answered at once
	event(t, sa.p, k1.aid, kernel.EventTimewaitExit)
	noEvent(t, sa.p, aid2)                                   // the new active side sees nothing...
	pid3 := event(t, sb.p, l, kernel.EventConnectRequest).ID // ...its REQ comes again
	ok(t, sb.p.TransitionQP(tgt2, verbs.QPStateRTR, pid3))
	ok(t, sb.p.Accept(pid3, tgtQPN2, nil))
	event(t, sa.p, aid2, kernel.EventConnectResponse)
}

// Rule: SIDR never enters the stale table: any number of SIDR exchanges
// with the same qp_num, beside a live connection with it.
func TestModelSIDRNotInStaleTable(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	lx := listen(t, sb.p, kernel.ExchangeXRC)
	lu := listen(t, sb.p, kernel.ExchangeSIDR) // same port number
	k := physLink(t, sa, sb, lx)
	before := a.StaleEntries() + b.StaleEntries()
	for i := 0; i < 3; i++ {
		id := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, k.iniQPN, []byte("virt")))
		req := event(t, sb.p, lu, kernel.EventConnectRequest)
		if req.QPNum != 0 || len(req.PrivateData) != 180 || string(req.PrivateData[:4]) != "virt" {
			t.Fatalf("SIDR REQ %+v", req)
		}
		ok(t, sb.p.Accept(req.ID, k.tgtQPN, []byte("ok")))
		e := event(t, sa.p, id, kernel.EventEstablished)
		if e.QPNum != k.tgtQPN || e.QKey != kernel.SIDRQKey || len(e.PrivateData) != 136 {
			t.Fatalf("SIDR REP %+v", e)
		}
		ok(t, sa.p.DestroyID(id))
		ok(t, sb.p.DestroyID(req.ID))
	}
	if a.StaleEntries()+b.StaleEntries() != before {
		t.Fatal("SIDR changed the stale table")
	}
	noEvent(t, sa.p, k.aid)
	noEvent(t, sb.p, lx)
}

// Rule: destroying an established XRC_RECV-typed id sends no DREQ; an
// XRC_SEND-typed or RC id sends one. rdma_disconnect on the TGT id does send.
func TestModelTGTIdDestroyNoDREQ(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb, l)
	ok(t, sb.p.DestroyID(k.pid))
	noEvent(t, sa.p, k.aid)
	ok(t, sa.p.Disconnect(k.aid)) // a later disconnect is answered at once
	event(t, sa.p, k.aid, kernel.EventDisconnected)
	event(t, sa.p, k.aid, kernel.EventTimewaitExit)

	k2 := physLink(t, sa, sb, l)
	ok(t, sa.p.DestroyID(k2.aid)) // INI side: DREQ
	event(t, sb.p, k2.pid, kernel.EventDisconnected)

	k3 := physLink(t, sa, sb, l)
	ok(t, sb.p.Disconnect(k3.pid)) // TGT side disconnect: DREQ
	event(t, sa.p, k3.aid, kernel.EventDisconnected)

	pa, pb := a.NewProcess(), b.NewProcess()
	lr := must[kernel.ID](t)(pb.Listen(netip.AddrPortFrom(addrB, 7000), kernel.ExchangeRC))
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), netip.AddrPortFrom(addrB, 7000), kernel.ExchangeRC, 0x500, nil))
	s := event(t, pb, lr, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s, 0x600, nil))
	event(t, pa, c, kernel.EventConnectResponse)
	ok(t, pa.Establish(c))
	ok(t, pb.DestroyID(s)) // RC passive: DREQ
	event(t, pa, c, kernel.EventDisconnected)
}

// Rule: private-data budgets, EINVAL one byte over, zero padding to the
// maximum on receipt; a failed accept rejects the peer, a failed reject
// leaves the request pending, a failed connect creates nothing.
func TestModelPrivateDataBudgets(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	lu := listen(t, pb, kernel.ExchangeSIDR)
	dst := addrPort(addrB)
	big := func(n int) []byte { return bytes.Repeat([]byte{0xAB}, n) }

	if _, err := pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, big(57)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("REQ 57: %v", err)
	}
	if pa.Handles() != 0 {
		t.Fatal("failed connect left an id")
	}
	if _, err := pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, big(181)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("SIDR REQ 181: %v", err)
	}
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, big(8)))
	req := event(t, pb, lx, kernel.EventConnectRequest)
	if len(req.PrivateData) != 56 || !bytes.Equal(req.PrivateData[:8], big(8)) || !allZero(req.PrivateData[8:]) {
		t.Fatalf("REQ data %x", req.PrivateData)
	}
	if err := pb.Reject(req.ID, big(149)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("REJ 149: %v", err)
	}
	noEvent(t, pa, c) // still pending
	if err := pb.Accept(req.ID, 0x200, big(197)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("REP 197: %v", err)
	}
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !allZero(e.PrivateData) {
		t.Fatalf("failed accept: %+v", e)
	}
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x101, big(56)))
	req = event(t, pb, lx, kernel.EventConnectRequest)
	ok(t, pb.Accept(req.ID, 0x201, big(196)))
	if e := event(t, pa, c, kernel.EventConnectResponse); len(e.PrivateData) != 196 || !bytes.Equal(e.PrivateData, big(196)) {
		t.Fatalf("REP data %d", len(e.PrivateData))
	}
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x102, nil))
	req = event(t, pb, lx, kernel.EventConnectRequest)
	ok(t, pb.Reject(req.ID, big(3)))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || len(e.PrivateData) != 148 || !bytes.Equal(e.PrivateData[:3], big(3)) {
		t.Fatalf("REJ %+v", e)
	}
	// SIDR: REQ 180 ok, REP/reject 136, 137 EINVAL.
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, big(180)))
	req = event(t, pb, lu, kernel.EventConnectRequest)
	if len(req.PrivateData) != 180 {
		t.Fatalf("SIDR REQ %d", len(req.PrivateData))
	}
	if err := pb.Reject(req.ID, big(137)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("SIDR REJ 137: %v", err)
	}
	if err := pb.Accept(req.ID, 0x300, big(137)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("SIDR REP 137: %v", err)
	}
	if e := event(t, pa, s, kernel.EventUnreachable); e.Status != kernel.SIDRRejected {
		t.Fatalf("failed SIDR accept: %+v", e)
	}
	s = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, nil))
	req = event(t, pb, lu, kernel.EventConnectRequest)
	ok(t, pb.Accept(req.ID, 0x1ABCDEF, big(136)))
	if e := event(t, pa, s, kernel.EventEstablished); len(e.PrivateData) != 136 || e.QPNum != 0xABCDEF {
		t.Fatalf("SIDR REP %d bytes qp %#x", len(e.PrivateData), e.QPNum)
	}
}

// Rule: a REQ whose QP type does not match the listener's is REJECTED 28
// with zero data, and the listener sees nothing.
func TestModelQPTypeMismatchRejected28(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeIBRC, 0x100, []byte("rc")))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !allZero(e.PrivateData) {
		t.Fatalf("RC to XRC: %+v", e)
	}
	noEvent(t, pb, lx)
	ok(t, pb.DestroyID(lx))
	lr := listen(t, pb, kernel.ExchangeIBRC)
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x101, []byte("x")))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !allZero(e.PrivateData) {
		t.Fatalf("XRC to RC: %+v", e)
	}
	noEvent(t, pb, lr)
}

// Rule: no listener: REJECTED 8 (connected), UNREACHABLE 1 (SIDR); a SIDR
// reject is UNREACHABLE 2 with its data.
func TestModelNoListenerAndSIDRReject(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejInvalidServiceID {
		t.Fatalf("%+v", e)
	}
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, 0, nil))
	if e := event(t, pa, s, kernel.EventUnreachable); e.Status != kernel.SIDRNoListener {
		t.Fatalf("%+v", e)
	}
	// An XRC listener does not answer SIDR.
	listen(t, pb, kernel.ExchangeXRC)
	s = must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, 0, nil))
	event(t, pa, s, kernel.EventUnreachable)
	lu := listen(t, pb, kernel.ExchangeSIDR)
	s = must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, 0, nil))
	ok(t, pb.Reject(event(t, pb, lu, kernel.EventConnectRequest).ID, []byte("no")))
	if e := event(t, pa, s, kernel.EventUnreachable); e.Status != kernel.SIDRRejected || len(e.PrivateData) != 136 || string(e.PrivateData[:2]) != "no" {
		t.Fatalf("%+v", e)
	}
	if _, err := pa.Connect(ctxT(t), netip.AddrPortFrom(netip.MustParseAddr("10.9.9.9"), 1), kernel.ExchangeSIDR, 0, nil); !isErrno(err, syscall.EHOSTUNREACH) {
		t.Fatalf("unknown address: %v", err)
	}
	if _, err := pb.Listen(addrPort(addrB), kernel.ExchangeSIDR); !isErrno(err, syscall.EADDRINUSE) {
		t.Fatalf("double listen: %v", err)
	}
}

// Rule: after CONNECT_RESPONSE, rdma_disconnect sends nothing; rdma_reject
// on the active id reaches the passive side as REJECTED 28 with data, and a
// destroy as REJECTED 28 without.
func TestModelAbortAfterConnectResponse(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	start := func(qpn uint32) (kernel.ID, kernel.ID) {
		c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, qpn, nil))
		s := event(t, pb, l, kernel.EventConnectRequest).ID
		ok(t, pb.Accept(s, qpn+0x1000, nil))
		event(t, pa, c, kernel.EventConnectResponse)
		return c, s
	}
	c, s := start(0x100)
	ok(t, pa.Disconnect(c))
	noEvent(t, pb, s)
	ok(t, pa.Reject(c, []byte("qp failed")))
	if e := event(t, pb, s, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || string(e.PrivateData[:9]) != "qp failed" {
		t.Fatalf("%+v", e)
	}
	c, s = start(0x101)
	ok(t, pa.DestroyID(c))
	if e := event(t, pb, s, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !allZero(e.PrivateData) {
		t.Fatalf("%+v", e)
	}
}

// Rule: the graceful teardown: DREQ → DISCONNECTED at the peer, DREP →
// DISCONNECTED at the sender, then TIMEWAIT_EXIT on both; the stale entries
// are gone after it.
func TestModelDisconnectSequence(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	if a.StaleEntries() != 1 || b.StaleEntries() != 1 {
		t.Fatalf("stale entries %d/%d", a.StaleEntries(), b.StaleEntries())
	}
	teardown(t, sa, sb, k)
	if a.StaleEntries() != 0 || b.StaleEntries() != 0 {
		t.Fatal("entries survive the teardown")
	}
}

// Rule: qp_num travels in 24 bits.
func TestModelQPNum24Bits(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeRC)
	must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeRC, 0xAB123456, nil))
	if e := event(t, pb, l, kernel.EventConnectRequest); e.QPNum != 0x123456 {
		t.Fatalf("%#x", e.QPNum)
	}
}

// Rule: the death of a process sends the DREQs its ids would send, and
// rejects what it had pending.
func TestModelProcessDeathCMIDs(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeRC)
	c1 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeRC, 0x100, nil))
	s1 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s1, 0x200, nil))
	event(t, pa, c1, kernel.EventConnectResponse)
	ok(t, pa.Establish(c1))
	c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeRC, 0x101, nil))
	pb.Kill()
	event(t, pa, c1, kernel.EventDisconnected)
	if e := event(t, pa, c2, kernel.EventRejected); e.Status != kernel.RejConsumerDefined {
		t.Fatalf("pending request of a dead listener: %+v", e)
	}
	if b.StaleEntries() != 0 {
		t.Fatal("stale entries of a dead process")
	}
}

// PowerOff: the node's processes die without a word (the peer of an
// established link hears nothing), requests to it get no answer, a DREQ to
// it times out at once, and sends to it fail as retries running out do.
func TestModelPowerOff(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	b.PowerOff()
	if h := sb.p.Handles(); h != 0 {
		t.Fatalf("a process on the node that went off holds %d handles", h)
	}
	if ini, tgt := b.QPCount(); ini+tgt != 0 {
		t.Fatalf("QPs left on the node that went off: %d INI, %d TGT", ini, tgt)
	}
	noEvent(t, sa.p, k.aid) // no DREQ came from b
	if c := send(t, sa.p, k.ini, sb.srqn, 1, "x"); c.Status != verbs.WCRetryExcErr {
		t.Fatalf("a send to the node that went off: %v, want WCRetryExcErr", c.Status)
	}
	ok(t, sa.p.Disconnect(k.aid))
	event(t, sa.p, k.aid, kernel.EventDisconnected)
	event(t, sa.p, k.aid, kernel.EventTimewaitExit)
	ok(t, sa.p.DestroyID(k.aid))
	if n := a.StaleEntries(); n != 0 {
		t.Fatalf("%d stale entries left on a", n)
	}
	// Requests to it, connected and SIDR, get no answer; a process started
	// on it later reaches nothing either.
	_, iniQPN, err := sa.p.CreateINI()
	ok(t, err)
	id := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(b.Addr()), kernel.ExchangeXRC, iniQPN, []byte("req")))
	noEvent(t, sa.p, id)
	ok(t, sa.p.DestroyID(id))
	sid := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(b.Addr()), kernel.ExchangeSIDR, 0, []byte("req")))
	noEvent(t, sa.p, sid)
	ok(t, sa.p.DestroyID(sid))
	later := b.NewProcess()
	lid := must[kernel.ID](t)(later.Connect(ctxT(t), addrPort(a.Addr()), kernel.ExchangeSIDR, 0, []byte("req")))
	noEvent(t, later, lid)
}
