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
