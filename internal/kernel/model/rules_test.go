package model

import (
	"errors"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// facts.md/FINDINGS 2e: one node, INI number equal to a live connection's TGT number.
func TestModelOneNodeCrossRole(t *testing.T) {
	f := NewFabric(ReuseNever)
	a := f.AddNode(addrA, NodeConfig{})
	p := a.NewProcess()
	l := listen(t, p, kernel.ExchangeRC)
	c1 := must[kernel.ID](t)(p.Connect(ctxT(t), addrPort(addrA), kernel.ExchangeRC, 0x123456, nil))
	s1 := event(t, p, l, kernel.EventConnectRequest).ID
	ok(t, p.Accept(s1, 0x654321, nil))
	event(t, p, c1, kernel.EventConnectResponse)
	ok(t, p.Establish(c1))
	event(t, p, s1, kernel.EventEstablished)
	c2 := must[kernel.ID](t)(p.Connect(ctxT(t), addrPort(addrA), kernel.ExchangeRC, 0x654321, nil))
	if e := event(t, p, c2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatal(e)
	}
	event(t, p, s1, kernel.EventDisconnected)
}

// facts.md: any holder can modify a shared TGT.
func TestModelOpenerModifiesSharedTGT(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	sb1, sb2 := newSide(t, b, path), newSide(t, b, path)
	k := physLink(t, sa, sb1, listen(t, sb1.p, kernel.ExchangeXRC))
	h := must[kernel.QP](t)(sb2.p.OpenTGT(sb2.d, k.tgtQPN))
	ok(t, sb2.p.TransitionQP(h, verbs.QPStateErr, 0))
	if info := must[kernel.QPInfo](t)(sb1.p.QueryQP(k.tgt)); info.State != verbs.QPStateErr {
		t.Fatalf("creator sees %v", info.State)
	}
	if c := send(t, sa.p, k.ini, sb1.srqn, 1, "x"); c.Status != verbs.WCRetryExcErr {
		t.Fatalf("send through a TGT an opener moved to ERR: %v", c.Status)
	}
	// But not to RESET, as the real seam refuses it (mlx5 writes a
	// doorbell record that an opened handle lacks; docs/xrc-protocol.md):
	// the model allowed it, so an engine that did would pass here only
	// (found by a review).
	if err := sb2.p.TransitionQP(h, verbs.QPStateReset, 0); !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET through an opened handle: %v, want EINVAL", err)
	}
}

// facts.md: a sender with a stale SRQN may deliver into a stranger's SRQ.
func TestModelStaleSRQNReachesStranger(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, path)
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	old := sb.srqn
	ok(t, sb.p.DestroySRQ(sb.srq))
	stranger := newSide(t, b, path)
	if stranger.srqn != old {
		t.Fatalf("setup: SRQN not reused")
	}
	if c := send(t, sa.p, k.ini, old, 9, "misdelivered"); c.Status != verbs.WCSuccess {
		t.Fatal(c.Status)
	}
	if r := recv(t, stranger); r.Imm != 9 {
		t.Fatalf("%+v", r)
	}
}

// ib_uverbs_open_xrcd: O_EXCL is checked on its own (no O_CREAT needed).
func TestModelXRCDExclWithoutCreate(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	path := domainFile(t)
	p := a.NewProcess()
	if _, err := p.OpenXRCD(path, kernel.XRCDExcl); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("excl, none yet: %v", err)
	}
	must[kernel.XRCD](t)(p.OpenXRCD(path, kernel.XRCDCreate))
	if _, err := p.OpenXRCD(path, kernel.XRCDExcl); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("excl, exists: %v", err)
	}
}

// uverbs_free_xrcd: EBUSY counts the uobject's own users, not the process's.
func TestModelXRCDEBUSYPerHandle(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	path := domainFile(t)
	s := newSide(t, a, path)
	d2 := must[kernel.XRCD](t)(s.p.OpenXRCD(path, 0))
	ok(t, s.p.CloseXRCD(d2)) // the SRQ is s.d's
	if err := s.p.CloseXRCD(s.d); !isErrno(err, syscall.EBUSY) {
		t.Fatal(err)
	}
}

// facts.md: "qp_num is carried in 24 bits": the REP's too.
func TestModelQPNum24BitsREP(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
	ok(t, pb.Accept(event(t, pb, l, kernel.EventConnectRequest).ID, 0xAB654321, nil))
	if e := event(t, pa, c, kernel.EventConnectResponse); e.QPNum != 0x654321 {
		t.Fatalf("CONNECT_RESPONSE qp_num %#x, want 0x654321", e.QPNum)
	}
}

// facts.md: SIDR works beside RC and XRC listeners on the same port number,
// each request reaching its own listener (three port spaces); XRC and IB-RC
// share RDMA_PS_IB, so only one of them listens on a port.
func TestModelRCXRCSIDRListenersShareAPort(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	ls := map[kernel.Exchange]kernel.ID{}
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeRC, kernel.ExchangeSIDR} {
		ls[ex] = listen(t, pb, ex)
	}
	if _, err := pb.Listen(addrPort(addrB), kernel.ExchangeIBRC); !isErrno(err, syscall.EADDRINUSE) {
		t.Fatalf("IB-RC listener beside an XRC one on its port: %v, want EADDRINUSE", err)
	}
	for i, ex := range []kernel.Exchange{kernel.ExchangeRC, kernel.ExchangeSIDR, kernel.ExchangeXRC} {
		must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), ex, uint32(0x100+i), []byte(ex.String())))
		e := event(t, pb, ls[ex], kernel.EventConnectRequest)
		if string(e.PrivateData[:len(ex.String())]) != ex.String() {
			t.Fatalf("the %v listener got %q", ex, e.PrivateData)
		}
		for other, l := range ls {
			if other != ex {
				noEvent(t, pb, l)
			}
		}
	}
}

// facts.md: a TGT QP is receive only (the INI send only): posting or polling
// sends on it is refused, whatever its state.
func TestModelTGTReceivesOnly(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	ok(t, sb.p.TransitionQP(k.tgt, verbs.QPStateRTS, k.pid))
	if err := sb.p.PostSend(k.tgt, []kernel.SendWR{{WRID: 1, RemoteSRQN: sa.srqn}}); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("post on a TGT in RTS: %v, want EINVAL", err)
	}
	if _, err := sb.p.PollSend(ctxT(t), k.tgt, make([]kernel.SendCompletion, 1)); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("poll of a TGT's sends: %v, want EINVAL", err)
	}
}

// facts.md: "fd = -1 gives a private XRCD": it is no file's domain, and two
// are two domains.
func TestModelPrivateXRCDIsNoFiles(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	p := a.NewProcess()
	must[kernel.XRCD](t)(p.OpenXRCD("", 0))
	if _, err := p.OpenXRCD(domainFile(t), 0); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("a file's domain opened while only a private one exists: %v, want EAGAIN", err)
	}
	must[kernel.XRCD](t)(a.NewProcess().OpenXRCD("", 0))
	if n := a.XRCDs(); n != 2 {
		t.Fatalf("%d domains after two private opens, want 2", n)
	}
}

// facts.md: an XRCD is bound to a device and an inode: the same file on
// another node (device) names another domain.
func TestModelXRCDPerDevice(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, path)
	_, qpn, err := sa.p.CreateTGT(sa.d)
	ok(t, err)
	pb := b.NewProcess()
	if _, err := pb.OpenXRCD(path, 0); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("node B found node A's domain of the file: %v, want EAGAIN", err)
	}
	db := must[kernel.XRCD](t)(pb.OpenXRCD(path, kernel.XRCDCreate))
	if _, err := pb.OpenTGT(db, qpn); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("node B opened node A's TGT: %v, want EINVAL", err)
	}
	if a.XRCDs() != 1 || b.XRCDs() != 1 {
		t.Fatalf("domains A %d B %d, want 1 each", a.XRCDs(), b.XRCDs())
	}
}

// A listener destroyed with requests its process has not taken destroys
// their ids too (ucma_free_ctx), which rejects the dialers: REJECTED 28,
// SIDR UNREACHABLE 2. (Process death covers it only because every id goes.)
func TestModelListenerDestroyRejectsUntaken(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx, lu := listen(t, pb, kernel.ExchangeXRC), listen(t, pb, kernel.ExchangeSIDR)
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, 0, nil))
	handles := pb.Handles()
	ok(t, pb.DestroyID(lx))
	ok(t, pb.DestroyID(lu))
	if e := event(t, pa, c, kernel.EventRejected); e.Status != kernel.RejConsumerDefined {
		t.Fatalf("dialer of a destroyed listener: %+v, want REJECTED 28", e)
	}
	if e := event(t, pa, s, kernel.EventUnreachable); e.Status != kernel.SIDRRejected {
		t.Fatalf("SIDR dialer of a destroyed listener: %+v, want UNREACHABLE 2", e)
	}
	if n := pb.Handles(); n != handles-4 {
		t.Fatalf("%d handles left, want %d: the untaken requests' ids outlived their listener", n, handles-4)
	}
	if b.StaleEntries() != 0 {
		t.Fatal("the untaken request's stale entry outlived it")
	}
}
