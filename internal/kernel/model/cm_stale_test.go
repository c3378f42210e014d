package model

import (
	"context"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// established runs one XRC-typed CM exchange with made-up QP numbers and
// returns the active and passive ids.
func established(t *testing.T, pa, pb *Process, l kernel.ID, ini, tgt uint32) (kernel.ID, kernel.ID) {
	t.Helper()
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, ini, nil))
	s := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s, tgt, nil))
	event(t, pa, c, kernel.EventConnectResponse)
	ok(t, pa.Establish(c))
	event(t, pb, s, kernel.EventEstablished)
	return c, s
}

// expectStale checks that the next event on c is REJECTED 10 and that the
// listener saw nothing.
func expectStale(t *testing.T, pa, pb *Process, c, l kernel.ID) {
	t.Helper()
	e, err := pa.Event(ctxShort(t), c)
	if err != nil || e.Type != kernel.EventRejected || e.Status != kernel.RejStaleConn {
		if r, err2 := pb.Event(ctxShort(t), l); err2 == nil {
			t.Fatalf("new REQ got %v/%v (err %v); the listener got %v: the old entry had already left the table", e.Type, e.Status, err, r.Type)
		}
		t.Fatalf("new REQ got %v status %d (err %v), want REJECTED 10", e.Type, e.Status, err)
	}
}

func ctxShort(t *testing.T) context.Context {
	ctx, cancel := contextShort()
	t.Cleanup(cancel)
	return ctx
}

// Rule: ib_cm keeps a connection's (remote node, remote QPN) entry until
// the id enters timewait (cm_enter_timewait: DREP sent or received) or is
// destroyed; cm_send_dreq_locked and cm_dreq_handler only change the state.
// (The model once dropped both ends' entries with the DREQ.)
func TestModelStaleEntryHeldUntilDREP(t *testing.T) {
	t.Run("DREQ received, DREP not sent yet", func(t *testing.T) {
		_, a, b := twoNodes(t, ReuseNever)
		pa, pb := a.NewProcess(), b.NewProcess()
		l := listen(t, pb, kernel.ExchangeXRC)
		c1, s1 := established(t, pa, pb, l, 0x123456, 0x654321)
		ok(t, pa.DestroyID(c1)) // e.g. the sender process died: DREQ
		event(t, pb, s1, kernel.EventDisconnected)
		// s1 is in DREQ_RCVD: its entry (A, 0x123456) is still in B's table.
		// A new process on A got the same INI number:
		c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
		expectStale(t, pa, pb, c2, l)
	})
	t.Run("retry right after REJ 10", func(t *testing.T) {
		_, a, b := twoNodes(t, ReuseNever)
		pa, pb := a.NewProcess(), b.NewProcess()
		l := listen(t, pb, kernel.ExchangeXRC)
		c1, _ := established(t, pa, pb, l, 0x123456, 0x654321)
		c2 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
		expectStale(t, pa, pb, c2, l)
		event(t, pa, c1, kernel.EventDisconnected) // the kernel's DREQ, not answered yet
		// cm_match_req removed only the new id's entry; s1's stays until c1's DREP.
		c3 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123456, nil))
		expectStale(t, pa, pb, c3, l)
	})
	t.Run("DREQ sent, DREP not received yet", func(t *testing.T) {
		_, a, b := twoNodes(t, ReuseNever)
		pa, pb := a.NewProcess(), b.NewProcess()
		l := listen(t, pb, kernel.ExchangeXRC)
		c1, s1 := established(t, pa, pb, l, 0x123456, 0x654321)
		ok(t, pa.Disconnect(c1)) // c1 DREQ_SENT: holds (B, 0x654321) on A
		event(t, pb, s1, kernel.EventDisconnected)
		must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x123457, nil))
		s2 := event(t, pb, l, kernel.EventConnectRequest).ID
		ok(t, pb.Accept(s2, 0x654321, nil)) // the TGT number came back
		if e, err := pb.Event(ctxShort(t), s2); err != nil || e.Status != kernel.RejStaleConn {
			t.Fatalf("REP naming a number A's DREQ_SENT id still holds: passive got %v %d (err %v), want REJECTED 10", e.Type, e.Status, err)
		}
	})
}

// Rule: at REP time cm_rep_handler calls ib_send_cm_dreq on the old id,
// which cm_send_dreq_locked refuses unless it is established; a pending old
// connection is untouched and its entry stays.
func TestModelREPStaleDREQsOnlyEstablished(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	c1 := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
	s1 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s1, 0x500, nil))
	event(t, pa, c1, kernel.EventConnectResponse) // c1 in REP_RCVD, not established
	must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x101, nil))
	s2 := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s2, 0x500, nil))
	if e := event(t, pb, s2, kernel.EventRejected); e.Status != kernel.RejStaleConn {
		t.Fatalf("%+v", e)
	}
	if e, err := pa.Event(ctxShort(t), c1); err == nil {
		t.Errorf("pending connection c1 got %v: a DREQ the kernel does not send", e.Type)
	}
	if err := pa.Establish(c1); err != nil {
		t.Fatalf("rdma_establish on the untouched pending connection: %v", err)
	}
	event(t, pb, s1, kernel.EventEstablished)
}

// Rule: rdma_init_qp_attr (cm_init_qp_rtr_attr) answers EINVAL unless the
// id is in REQ_RCVD..ESTABLISHED: a QP cannot reach RTR through an id whose
// peer has gone.
func TestModelInitQPAttrNeedsLiveID(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k := physRequest(t, sa, sb, l)
	c, pid := k.aid, k.pid
	ok(t, sa.p.DestroyID(c)) // the dialer gave up: REJ(timeout) to pid, which goes IDLE
	// No event: ucma drops a new connection's events until rdma_accept
	// (kcm's TestPathOfFollowsTheKernelCM sees none on rxe).
	if e, err := sb.p.Event(ctxShort(t), pid); err == nil {
		t.Errorf("the unaccepted id got %v (status %d): the kernel delivers nothing before accept", e.Type, e.Status)
	}
	tgt, tgtNum, _ := sb.p.CreateTGT(sb.d)
	if err := sb.p.TransitionQP(tgt, verbs.QPStateRTR, pid); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("RTR through an id the peer rejected: %v, want EINVAL", err)
	}
	if err := sb.p.Accept(pid, tgtNum, nil); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("accept of a request whose dialer gave up: %v, want EINVAL", err)
	}
}

// Rule: rdma_accept rejects the peer whenever it fails after its state
// check (cma.c: "goto reject", then rdma_reject, REJECTED 28), not only on a
// budget overrun; a second accept fails in ib_send_cm_rep (REP_SENT).
func TestModelAnyFailedAcceptRejects(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	l := listen(t, pb, kernel.ExchangeXRC)
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
	s := event(t, pb, l, kernel.EventConnectRequest).ID
	ok(t, pb.Accept(s, 0x200, nil))
	event(t, pa, c, kernel.EventConnectResponse)
	if err := pb.Accept(s, 0x200, nil); !isErrno(err, syscall.EINVAL) {
		t.Fatal(err)
	}
	if e, err := pa.Event(ctxShort(t), c); err != nil || e.Type != kernel.EventRejected || e.Status != kernel.RejConsumerDefined {
		t.Fatalf("after a failed second rdma_accept the active side got %v (err %v), want REJECTED 28", e.Type, err)
	}
}
