package model

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// facts.md rules at the edges the other tests left open: each
// checks the rule's exact errno, ordering or edge.

// facts.md: a domain is bound to the inode of the file, not its path: a
// hard link and a symlink to the file open the same domain (EINVAL for an
// exclusive create through either, and the TGT opens by number through
// it).
func TestModelXRCDKeyedByInodeNotPath(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	path := domainFile(t)
	dir := filepath.Dir(path)
	hard, soft := filepath.Join(dir, "hard"), filepath.Join(dir, "soft")
	ok(t, os.Link(path, hard))
	ok(t, os.Symlink(path, soft))
	s := newSide(t, a, path)
	_, qpn, err := s.p.CreateTGT(s.d)
	ok(t, err)
	for _, p := range []string{hard, soft} {
		q := a.NewProcess()
		if _, err := q.OpenXRCD(p, kernel.XRCDCreate|kernel.XRCDExcl); !isErrno(err, syscall.EINVAL) {
			t.Fatalf("%s: exclusive create of the inode's existing domain: %v, want EINVAL", p, err)
		}
		d := must[kernel.XRCD](t)(q.OpenXRCD(p, 0))
		must[kernel.QP](t)(q.OpenTGT(d, qpn))
	}
	if n := a.XRCDs(); n != 1 {
		t.Fatalf("%d domains for one inode, want 1", n)
	}
	if n := a.TGTHandles(qpn); n != 3 {
		t.Fatalf("use count %d, want 3", n)
	}
}

// facts.md: EBUSY comes from ibv_close_xrcd while QPs/SRQs made through the
// handle live, an opened TGT handle included (ib_uverbs_open_qp takes the
// uxrcd's refcnt as a create does); an INI, bound to no domain, never
// makes it busy; the refused close leaves the handle working; and nothing
// else answers EBUSY (the TGT, SRQ destroys under it succeed).
func TestModelXRCDEBUSYOpenedTGTAndINI(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	path := domainFile(t)
	owner := newSide(t, a, path)
	_, qpn, err := owner.p.CreateTGT(owner.d)
	ok(t, err)

	p := a.NewProcess()
	d := must[kernel.XRCD](t)(p.OpenXRCD(path, 0))
	ini, _, err := p.CreateINI()
	ok(t, err)
	h := must[kernel.QP](t)(p.OpenTGT(d, qpn))
	if err := p.CloseXRCD(d); !isErrno(err, syscall.EBUSY) {
		t.Fatalf("close with an opened TGT handle: %v, want EBUSY", err)
	}
	// The handle is still open and usable.
	s, _, err := p.CreateSRQ(d, testSlot)
	ok(t, err)
	ok(t, p.DestroySRQ(s))
	ok(t, p.DestroyQP(h))
	if n := a.TGTHandles(qpn); n != 1 {
		t.Fatalf("use count %d after the opener's destroy, want 1 (the creator's)", n)
	}
	ok(t, p.CloseXRCD(d)) // the INI does not hold the domain
	must[kernel.QPInfo](t)(p.QueryQP(ini))
	if n := a.XRCDs(); n != 1 {
		t.Fatalf("%d domains, want 1 (the owner's)", n)
	}
}

// facts.md: ibv_open_qp finds the TGT by number in the domain given: a
// live TGT of another shared domain on the same node is not found (EINVAL,
// as an unknown number), and the failed open takes no use count and does
// not make the domain busy.
func TestModelOpenTGTOtherSharedDomainEINVAL(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	s1 := newSide(t, a, domainFile(t))
	_, qpn, err := s1.p.CreateTGT(s1.d)
	ok(t, err)
	p := a.NewProcess()
	d2 := must[kernel.XRCD](t)(p.OpenXRCD(domainFile(t), kernel.XRCDCreate))
	if _, err := p.OpenTGT(d2, qpn); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("open of another domain's TGT: %v, want EINVAL", err)
	}
	if n := a.TGTHandles(qpn); n != 1 {
		t.Fatalf("use count %d after a failed open, want 1", n)
	}
	ok(t, p.CloseXRCD(d2))
}

// facts.md: destroying a handle while others remain returns 0 and removes
// only that handle: the TGT keeps its state and connection and carries
// traffic; the last handle's destroy kills it: sends through it fail as to
// a QP that is gone, its number no longer opens, and the domain it held
// goes with its last handle.
func TestModelTGTHandleDestroyWhileOthersRemain(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	creator, opener := newSide(t, b, path), newSide(t, b, path)
	k := physLink(t, sa, creator, listen(t, creator.p, kernel.ExchangeXRC))
	h := must[kernel.QP](t)(opener.p.OpenTGT(opener.d, k.tgtQPN))
	h2 := must[kernel.QP](t)(opener.p.OpenTGT(opener.d, k.tgtQPN))

	ok(t, opener.p.DestroyQP(h)) // an opener's handle, others remain
	info := must[kernel.QPInfo](t)(creator.p.QueryQP(k.tgt))
	if info.State != verbs.QPStateRTR || info.DestQPN != k.iniQPN || b.TGTHandles(k.tgtQPN) != 2 {
		t.Fatalf("after one opener's destroy: %+v, use count %d", info, b.TGTHandles(k.tgtQPN))
	}
	ok(t, creator.p.DestroyQP(k.tgt)) // the creator's, one remains
	info = must[kernel.QPInfo](t)(opener.p.QueryQP(h2))
	if info.State != verbs.QPStateRTR || info.DestQPN != k.iniQPN || b.TGTHandles(k.tgtQPN) != 1 {
		t.Fatalf("after the creator's destroy: %+v, use count %d", info, b.TGTHandles(k.tgtQPN))
	}
	if _, err := creator.p.QueryQP(k.tgt); !isErrno(err, syscall.EBADF) {
		t.Fatalf("the destroyed handle: %v, want EBADF", err)
	}
	if c := send(t, sa.p, k.ini, creator.srqn, 5, "alive"); c.Status != verbs.WCSuccess {
		t.Fatalf("send through a TGT with a handle left: %v", c.Status)
	}
	if r := recv(t, creator); r.Imm != 5 || r.TGTQPN != k.tgtQPN {
		t.Fatalf("%+v", r)
	}

	ok(t, opener.p.DestroyQP(h2)) // the last
	if n := b.TGTHandles(k.tgtQPN); n != 0 {
		t.Fatalf("use count %d after the last destroy", n)
	}
	if c := send(t, sa.p, k.ini, creator.srqn, 6, "dead"); c.Status != verbs.WCRetryExcErr {
		t.Fatalf("send through a dead TGT: %v, want WCRetryExcErr", c.Status)
	}
	if _, err := opener.p.OpenTGT(opener.d, k.tgtQPN); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("open of the dead TGT's number: %v, want EINVAL", err)
	}
	// The domain outlives the TGT while handles on it remain, and goes
	// with the last.
	if n := b.XRCDs(); n != 1 {
		t.Fatalf("%d domains", n)
	}
	ok(t, creator.p.DestroySRQ(creator.srq))
	ok(t, opener.p.DestroySRQ(opener.srq))
	ok(t, creator.p.CloseXRCD(creator.d))
	ok(t, opener.p.CloseXRCD(opener.d))
	if n := b.XRCDs(); n != 0 {
		t.Fatalf("%d domains after every handle closed", n)
	}
}

// facts.md: the stale REQ's DREQ goes to the FIRST connection only: the one
// holding (node, QPN). Another live connection of the same nodes is
// untouched, the rejected id gets REJECTED 10 and nothing more, the
// listener nothing; the first's passive id, which sent the DREQ, hears
// nothing until the DREP.
func TestModelStaleDREQToFirstOnly(t *testing.T) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeIBRC, kernel.ExchangeRC} {
		t.Run(ex.String(), func(t *testing.T) {
			_, a, b := twoNodes(t, ReuseNever)
			pa, pb := a.NewProcess(), b.NewProcess()
			other := a.NewProcess() // the stale REQ comes from another process
			l := listen(t, pb, ex)
			connect := func(p *Process, qpn, tgt uint32) (kernel.ID, kernel.ID) {
				c := must[kernel.ID](t)(p.Connect(ctxT(t), addrPort(addrB), ex, qpn, nil))
				s := event(t, pb, l, kernel.EventConnectRequest).ID
				ok(t, pb.Accept(s, tgt, nil))
				event(t, p, c, kernel.EventConnectResponse)
				ok(t, p.Establish(c))
				event(t, pb, s, kernel.EventEstablished)
				return c, s
			}
			c0, s0 := connect(pa, 0x100, 0x200)
			c1, s1 := connect(pa, 0x101, 0x201)
			c2 := must[kernel.ID](t)(other.Connect(ctxT(t), addrPort(addrB), ex, 0x101, nil))
			e := event(t, other, c2, kernel.EventRejected)
			if e.Status != kernel.RejStaleConn || len(e.PrivateData) != 148 || !allZero(e.PrivateData) {
				t.Fatalf("stale REQ: %+v", e)
			}
			event(t, pa, c1, kernel.EventDisconnected) // the first connection
			noEvent(t, other, c2)
			noEvent(t, pa, c0)
			noEvent(t, pb, s0)
			noEvent(t, pb, s1) // its DREQ is out, no DREP yet
			noEvent(t, pb, l)
			ok(t, pa.Disconnect(c1)) // the DREP
			event(t, pb, s1, kernel.EventDisconnected)
			event(t, pb, s1, kernel.EventTimewaitExit)
			event(t, pa, c1, kernel.EventTimewaitExit)
			noEvent(t, pa, c0)
			noEvent(t, pb, s0)
		})
	}
}

// facts.md: the budgets are exact in both directions for every message,
// the ones TestModelPrivateDataBudgets leaves out included: a REJ of 148
// bytes (passive reject, and the active side's abort after
// CONNECT_RESPONSE) arrives whole, 149 is EINVAL and sends nothing; a SIDR
// reject of 136 arrives whole.
func TestModelPrivateDataBudgetEdges(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	lu := listen(t, pb, kernel.ExchangeSIDR)
	dst := addrPort(addrB)
	big := func(n int) []byte { return bytes.Repeat([]byte{0xCD}, n) }

	// Passive REJ: 148 whole.
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, nil))
	req := event(t, pb, lx, kernel.EventConnectRequest)
	ok(t, pb.Reject(req.ID, big(148)))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !bytes.Equal(e.PrivateData, big(148)) {
		t.Fatalf("REJ 148: %+v", e)
	}
	// Active abort after CONNECT_RESPONSE: 149 EINVAL and nothing sent,
	// 148 whole.
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x101, nil))
	req = event(t, pb, lx, kernel.EventConnectRequest)
	ok(t, pb.Accept(req.ID, 0x201, nil))
	event(t, pa, c, kernel.EventConnectResponse)
	if err := pa.Reject(c, big(149)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("active REJ 149: %v, want EINVAL", err)
	}
	noEvent(t, pb, req.ID)
	ok(t, pa.Reject(c, big(148)))
	if e := event(t, pb, req.ID, kernel.EventRejected); e.Status != kernel.RejConsumerDefined || !bytes.Equal(e.PrivateData, big(148)) {
		t.Fatalf("active REJ 148: %+v", e)
	}
	// SIDR reject: 136 whole.
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, nil))
	req = event(t, pb, lu, kernel.EventConnectRequest)
	ok(t, pb.Reject(req.ID, big(136)))
	if e := event(t, pa, s, kernel.EventUnreachable); e.Status != kernel.SIDRRejected || !bytes.Equal(e.PrivateData, big(136)) {
		t.Fatalf("SIDR reject 136: %+v", e)
	}
}

// facts.md: the received length is always the maximum, zero-padded, for
// the rejects the kernel makes itself too (no listener: REJECTED 8 and
// SIDR UNREACHABLE 1; a QP-type mismatch: REJECTED 28; a stale REP:
// REJECTED 10 at the passive side; a failed accept: REJECTED 28).
func TestModelKernelRejectsZeroPadded(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	dst := addrPort(addrB)
	zeros := func(what string, e kernel.Event, typ kernel.EventType, status, n int) {
		t.Helper()
		if e.Type != typ || e.Status != status || len(e.PrivateData) != n || !allZero(e.PrivateData) {
			t.Fatalf("%s: %v status %d, %d bytes %x; want %v %d, %d zero bytes", what, e.Type, e.Status, len(e.PrivateData), e.PrivateData, typ, status, n)
		}
	}
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, []byte("x")))
	zeros("no listener", event(t, pa, c, kernel.EventRejected), kernel.EventRejected, kernel.RejInvalidServiceID, 148)
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, []byte("x")))
	zeros("SIDR no listener", event(t, pa, s, kernel.EventUnreachable), kernel.EventUnreachable, kernel.SIDRNoListener, 136)
	l := listen(t, pb, kernel.ExchangeXRC)
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeIBRC, 0x101, []byte("x")))
	zeros("type mismatch", event(t, pa, c, kernel.EventRejected), kernel.EventRejected, kernel.RejConsumerDefined, 148)
	// A stale REP: the passive side's REJECTED 10.
	c1, _ := established(t, pa, pb, l, 0x102, 0x500)
	_ = c1
	must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x103, nil))
	s2 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s2, 0x500, []byte("rep")))
	zeros("stale REP", event(t, pb, s2, kernel.EventRejected), kernel.EventRejected, kernel.RejStaleConn, 148)
}

// facts.md: "Private data pointers in an event are valid only until
// rdma_ack_cm_event: copy first": what an event carries is the kernel's
// copy, taken when the message was sent; the sender's buffer changing
// later changes nothing received.
func TestModelPrivateDataIsACopy(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	lu := listen(t, pb, kernel.ExchangeSIDR)
	dst := addrPort(addrB)
	buf := []byte("abc")
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, buf))
	copy(buf, "zzz")
	req := event(t, pb, lx, kernel.EventConnectRequest)
	if string(req.PrivateData[:3]) != "abc" {
		t.Fatalf("REQ %q", req.PrivateData[:3])
	}
	buf = []byte("def")
	ok(t, pb.Accept(req.ID, 0x200, buf))
	copy(buf, "zzz")
	if e := event(t, pa, c, kernel.EventConnectResponse); string(e.PrivateData[:3]) != "def" {
		t.Fatalf("REP %q", e.PrivateData[:3])
	}
	buf = []byte("ghi")
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, buf))
	copy(buf, "zzz")
	req = event(t, pb, lu, kernel.EventConnectRequest)
	if string(req.PrivateData[:3]) != "ghi" {
		t.Fatalf("SIDR REQ %q", req.PrivateData[:3])
	}
	ok(t, pb.Reject(req.ID, buf))
	copy(buf, "yyy")
	if e := event(t, pa, s, kernel.EventUnreachable); string(e.PrivateData[:3]) != "zzz" {
		t.Fatalf("SIDR reject %q", e.PrivateData[:3])
	}
	// The kernel's copy of a REQ serves its retransmission too (after a
	// stale REP): a REQ sent again carries what Connect was given.
	c1, s1 := established(t, pa, pb, lx, 0x101, 0x500)
	_ = c1
	ok(t, pb.DestroyID(s1)) // XRC_RECV id: silent; A still holds (B, 0x500)
	buf = []byte("jkl")
	must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x102, buf))
	copy(buf, "zzz")
	s2 := event(t, pb, lx, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s2, 0x500, nil)) // stale at A: REJ 10, the REQ comes again
	event(t, pb, s2, kernel.EventRejected)
	if e := event(t, pb, lx, kernel.EventConnectRequest); string(e.PrivateData[:3]) != "jkl" {
		t.Fatalf("retransmitted REQ %q", e.PrivateData[:3])
	}
}

// facts.md: a process's death closes all its handles and ids at once, as
// the destroys would, regardless of EBUSY: its opened TGT handles drop
// (the TGT lives for its other holders and carries traffic into their
// SRQs), its domain handles go though QPs and SRQs were made through
// them; its active id that got CONNECT_RESPONSE rejects the peer
// (REJECTED 28); its established XRC_SEND id sends a DREQ; its
// established XRC_RECV id sends nothing; its ids leave the stale tables.
func TestModelDeathClosesEverythingAtOnce(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	holder := newSide(t, b, path)
	victim := newSide(t, b, path) // TGT handles, an SRQ, a TGT-typed id, an INI-typed id
	lv := listen(t, victim.p, kernel.ExchangeXRC)
	lh := must[kernel.ID](t)(sa.p.Listen(netip.AddrPortFrom(addrA, 7000), kernel.ExchangeXRC))

	k := physLink(t, sa, victim, lv) // victim creates the TGT, holds the TGT-typed id
	must[kernel.QP](t)(holder.p.OpenTGT(holder.d, k.tgtQPN))
	must[kernel.QP](t)(victim.p.OpenTGT(victim.d, k.tgtQPN)) // a second handle of its own
	// victim's INI-typed, established connection to A.
	vini, vqpn, err := victim.p.CreateINI()
	ok(t, err)
	_ = vini
	vc := must[kernel.ID](t)(victim.p.Connect(ctxT(t), netip.AddrPortFrom(addrA, 7000), kernel.ExchangeXRC, vqpn, nil))
	as := event(t, sa.p, lh, kernel.EventConnectRequest).ID
	ok(t, sa.p.Accept(as, 0x777, nil))
	event(t, victim.p, vc, kernel.EventConnectResponse)
	ok(t, victim.p.Establish(vc))
	event(t, sa.p, as, kernel.EventEstablished)
	// And one after CONNECT_RESPONSE.
	pc := must[kernel.ID](t)(victim.p.Connect(ctxT(t), netip.AddrPortFrom(addrA, 7000), kernel.ExchangeXRC, vqpn+0x1000, nil))
	ps := event(t, sa.p, lh, kernel.EventConnectRequest).ID
	ok(t, sa.p.Accept(ps, 0x778, nil))
	event(t, victim.p, pc, kernel.EventConnectResponse)

	if b.TGTHandles(k.tgtQPN) != 3 {
		t.Fatalf("use count %d, want 3", b.TGTHandles(k.tgtQPN))
	}
	victim.p.Kill()
	if n := victim.p.Handles(); n != 0 {
		t.Fatalf("%d handles survive the death", n)
	}
	if n := b.TGTHandles(k.tgtQPN); n != 1 {
		t.Fatalf("use count %d after the death, want 1 (the holder's)", n)
	}
	if ini, _ := b.QPCount(); ini != 0 {
		t.Fatalf("%d INIs survive", ini)
	}
	noEvent(t, sa.p, k.aid)                      // XRC_RECV id: no DREQ
	event(t, sa.p, as, kernel.EventDisconnected) // XRC_SEND id: DREQ
	if e := event(t, sa.p, ps, kernel.EventRejected); e.Status != kernel.RejConsumerDefined {
		t.Fatalf("after CONNECT_RESPONSE: %+v, want REJECTED 28", e)
	}
	if c := send(t, sa.p, k.ini, holder.srqn, 9, "on"); c.Status != verbs.WCSuccess {
		t.Fatalf("send after the death: %v", c.Status)
	}
	if r := recv(t, holder); r.Imm != 9 {
		t.Fatalf("%+v", r)
	}
	if n := b.XRCDs(); n != 1 {
		t.Fatalf("%d domains, want 1 (the holder's)", n)
	}
	if n := b.StaleEntries(); n != 0 {
		t.Fatalf("%d stale entries on B after its only CM user died", n)
	}
}

// facts.md: a TGT delivers into ANY XRC SRQ of its XRCD named by the
// sender, and any TGT of the domain does: two TGTs (two senders, two
// nodes) fill one SRQ, each completion naming the TGT it came through; and
// the one TGT reaches an SRQ made after the connection.
func TestModelDeliveryAnyTGTAnySRQ(t *testing.T) {
	f := NewFabric(ReuseNever)
	a, b := f.AddNode(addrA, NodeConfig{}), f.AddNode(addrB, NodeConfig{})
	c := f.AddNode(netip.MustParseAddr("10.0.0.3"), NodeConfig{})
	path := domainFile(t)
	sb := newSide(t, b, path)
	l := listen(t, sb.p, kernel.ExchangeXRC)
	sa, sc := newSide(t, a, domainFile(t)), newSide(t, c, domainFile(t))
	ka, kc := physLink(t, sa, sb, l), physLink(t, sc, sb, l)
	if ka.tgtQPN == kc.tgtQPN {
		t.Fatal("setup: one TGT")
	}
	send(t, sa.p, ka.ini, sb.srqn, 1, "a")
	send(t, sc.p, kc.ini, sb.srqn, 2, "c")
	for _, want := range []struct {
		imm uint32
		tgt uint32
	}{{1, ka.tgtQPN}, {2, kc.tgtQPN}} {
		if r := recv(t, sb); r.Imm != want.imm || r.TGTQPN != want.tgt {
			t.Fatalf("%+v, want imm %d through %#x", r, want.imm, want.tgt)
		}
	}
	late := newSide(t, b, path) // another process, SRQ made after both connections
	send(t, sa.p, ka.ini, late.srqn, 3, "late")
	if r := recv(t, late); r.Imm != 3 || r.TGTQPN != ka.tgtQPN {
		t.Fatalf("%+v", r)
	}
}

// facts.md: ib_cm keys live connections by (remote CA GUID, remote QPN)
// alone, whatever the port space or QP type: an RC-typed REQ (RDMA_PS_TCP)
// reusing the INI number of a live XRC connection to the same node is
// REJECTED 10 and the XRC connection gets the DREQ; the RC listener sees
// nothing.
func TestModelStaleTableAcrossExchanges(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	lr := listen(t, pb, kernel.ExchangeRC)
	c1, _ := established(t, pa, pb, lx, 0x123456, 0x654321)
	c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeRC, 0x123456, nil))
	if e := event(t, pa, c2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatalf("RC REQ reusing a live XRC INI number: %+v, want REJECTED 10", e)
	}
	event(t, pa, c1, kernel.EventDisconnected)
	noEvent(t, pb, lr)
	noEvent(t, pb, lx)
}

// facts.md: the stale table is keyed by the REMOTE CA and QPN: the same
// INI number from another node is no stale connection (its REQ reaches
// the listener and connects, nobody gets a DREQ), and the same number
// toward another node neither.
func TestModelStaleKeyedByRemoteNode(t *testing.T) {
	f := NewFabric(ReuseNever)
	a, b := f.AddNode(addrA, NodeConfig{}), f.AddNode(addrB, NodeConfig{})
	addrC := netip.MustParseAddr("10.0.0.3")
	c := f.AddNode(addrC, NodeConfig{})
	pa, pb, pc := a.NewProcess(), b.NewProcess(), c.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	lc := listen(t, pc, kernel.ExchangeXRC)
	c1, s1 := established(t, pa, pb, l, 0x123456, 0x654321)
	// Node C, same INI number, to B.
	cc := must[kernel.ID](t)(pc.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
	s2 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s2, 0x654322, nil))
	event(t, pc, cc, kernel.EventConnectResponse)
	// Node A, same INI number, to C.
	ca := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrC), kernel.ExchangeXRC, 0x123456, nil))
	sc := event(t, pc, lc, kernel.EventConnectRequest).ID
	ok(t, pc.Accept(sc, 0x654321, nil)) // the TGT number of A's link to B, on another node
	event(t, pa, ca, kernel.EventConnectResponse)
	noEvent(t, pa, c1)
	noEvent(t, pb, s1)
}

// facts.md: destroying an established XRC_TGT-typed id sends no DREQ, ANY
// other type sends one: the passive ids of an RC listener on RDMA_PS_IB
// (IB-RC) and RDMA_PS_TCP, and the active ids of every exchange.
func TestModelOnlyXRCRecvIdsDestroySilently(t *testing.T) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeIBRC, kernel.ExchangeRC} {
		t.Run(ex.String(), func(t *testing.T) {
			_, a, b := twoNodes(t, ReuseNever)
			pa, pb := a.NewProcess(), b.NewProcess()
			l := listen(t, pb, ex)
			connect := func(qpn uint32) (kernel.ID, kernel.ID) {
				c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), ex, qpn, nil))
				s := event(t, pb, l, kernel.EventConnectRequest).ID
				ok(t, pb.Accept(s, qpn+0x1000, nil))
				event(t, pa, c, kernel.EventConnectResponse)
				ok(t, pa.Establish(c))
				event(t, pb, s, kernel.EventEstablished)
				return c, s
			}
			c, s := connect(0x100)
			ok(t, pb.DestroyID(s))
			if ex == kernel.ExchangeXRC {
				noEvent(t, pa, c)
			} else {
				event(t, pa, c, kernel.EventDisconnected)
			}
			c, s = connect(0x101)
			ok(t, pa.DestroyID(c))
			event(t, pb, s, kernel.EventDisconnected)
		})
	}
}
