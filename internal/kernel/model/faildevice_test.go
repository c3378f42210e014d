package model

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Rule (doc.go): a send waiting for a receive whose node goes "fails the
// first as a post would and flushes the rest"; FailDevice: "Its sends fail
// as sends to a node that is off do". The waiting send used to stay until
// some other kernel call ran retryRNR (found by review).
func TestModelFailDeviceEndsRNRWaits(t *testing.T) {
	_, b, sa, k := sendWaitingForReceive(t, NodeConfig{})
	b.FailDevice()
	var cs [4]kernel.SendCompletion
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	n, err := sa.p.PollSend(ctx, k.ini, cs[:])
	if err != nil {
		t.Fatalf("the send waiting for node %v's receive after its device failed: %v (no completion in 1 s); want WCRetryExcErr", addrB, err)
	}
	if cs[0].WRID != 2 || cs[0].Status != verbs.WCRetryExcErr {
		t.Fatalf("%+v", cs[:n])
	}
}

// sendWaitingForReceive links node a (configured as ca) to node b, whose
// SRQ takes one receive, and posts two sends on the INI: the first is
// delivered and completes, the second waits for a receive (RNR).
func sendWaitingForReceive(t *testing.T, ca NodeConfig) (a, b *Node, sa *side, k link) {
	t.Helper()
	f := NewFabric(ReuseLIFO)
	a = f.AddNode(addrA, ca)
	b = f.AddNode(addrB, NodeConfig{SRQReceives: 1})
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k = physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{
		{WRID: 1, RemoteSRQN: sb.srqn, Payload: []byte{1}},
		{WRID: 2, RemoteSRQN: sb.srqn, Payload: []byte{2}}, // no receive left: waits (RNR)
	}))
	var cs [4]kernel.SendCompletion
	if n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, cs[:])); n != 1 || cs[0].WRID != 1 {
		t.Fatalf("%+v", cs[:n])
	}
	return a, b, sa, k
}

// FailDevice: "the node sends nothing and answers nothing, as after
// PowerOff, but its processes live on". The failed node's processes used
// to reach their peers through the CM: a Disconnect sent a DREQ, an Accept
// a REP (found by review). Now the posts fail at the sender, as mlx5's do:
// the calls that send return EIO, a DREQ goes to timewait without a word.
func TestModelFailedDeviceSendsNoCM(t *testing.T) {
	t.Run("DREQ", func(t *testing.T) {
		_, a, b := twoNodes(t, ReuseNever)
		sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
		k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
		a.FailDevice()
		ok(t, sa.p.Disconnect(k.aid)) // the engine's teardown of its uplink
		noEvent(t, sb.p, k.pid)
		// The DREQ's post fails at its sender, which hears nothing
		// either (no DREQ_ERROR; the TIMEWAIT_EXIT dropped by the CMA).
		noEvent(t, sa.p, k.aid)
	})
	t.Run("REP", func(t *testing.T) {
		_, a, b := twoNodes(t, ReuseNever)
		sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
		l := listen(t, sb.p, kernel.ExchangeXRC)
		k := physRequest(t, sa, sb, l)
		aid, pid := k.aid, k.pid
		b.FailDevice()
		if err := sb.p.Accept(pid, 0x999, nil); !isErrno(err, syscall.EIO) {
			t.Errorf("rdma_accept on a failed device: %v, want EIO (ib_send_cm_rep's post fails)", err)
		}
		noEvent(t, sa.p, aid)
		if err := sb.p.Reject(pid, nil); !isErrno(err, syscall.EIO) {
			t.Errorf("rdma_reject on a failed device: %v, want EIO", err)
		}
		noEvent(t, sa.p, aid)
		if _, err := sb.p.Connect(ctxT(t), addrPort(addrA), kernel.ExchangeSIDR, 0, nil); !isErrno(err, syscall.EIO) {
			t.Errorf("rdma_connect on a failed device: %v, want EIO", err)
		}
	})
}

// mlx5_internal_err_ret_value (drivers/net/ethernet/mellanox/mlx5/core/
// cmd.c), which deviceErr cites: RST2INIT/INIT2RTR/RTR2RTS_QP and QUERY_QP
// fail (EIO; ENOLINK since 6.5), 2ERR/2RST and the destroys succeed;
// ib_open_qp and opening an inode's existing XRCD run no firmware command.
func TestModelFailedDeviceVerbs(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, path)
	l := listen(t, sb.p, kernel.ExchangeXRC)
	pid := physRequest(t, sa, sb, l).pid
	tgt, tgtQPN, err := sb.p.CreateTGT(sb.d)
	ok(t, err)
	b.FailDevice()
	if err := sb.p.TransitionQP(tgt, verbs.QPStateRTR, pid); err == nil {
		t.Errorf("RESET->INIT->RTR on a failed device succeeded; mlx5 fails RST2INIT/INIT2RTR")
	}
	if _, err := sb.p.OpenTGT(sb.d, tgtQPN); err != nil {
		t.Errorf("OpenTGT (ib_open_qp, no firmware command) on a failed device: %v", err)
	}
	if _, err := sb.p.OpenXRCD(path, 0); err != nil {
		t.Errorf("OpenXRCD of the inode's existing domain (no ALLOC_XRCD) on a failed device: %v", err)
	}
	if _, err := sb.p.QueryQP(tgt); !isErrno(err, syscall.EIO) {
		t.Errorf("QueryQP (QUERY_QP) on a failed device: %v, want EIO", err)
	}
	ok(t, sb.p.DestroyQP(tgt))
}

// cm_init_qp_init_attr (cm.c): INIT attributes only from an id in REQ_SENT,
// REQ_RCVD, REP_SENT, REP_RCVD (and MRA states) or ESTABLISHED; -EINVAL
// otherwise (a listener, an id rejected back to idle, one in timewait).
func TestModelInitNeedsAConnectingID(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb, l)
	teardown2 := func() {
		ok(t, sa.p.Disconnect(k.aid))
		event(t, sb.p, k.pid, kernel.EventDisconnected)
		ok(t, sb.p.Disconnect(k.pid))
		event(t, sa.p, k.aid, kernel.EventDisconnected)
		event(t, sa.p, k.aid, kernel.EventTimewaitExit)
	}
	teardown2()
	ini, _, err := sa.p.CreateINI()
	ok(t, err)
	if err := sa.p.TransitionQP(ini, verbs.QPStateInit, k.aid); err == nil {
		t.Errorf("RESET->INIT via an id in timewait succeeded; cm_init_qp_init_attr gives EINVAL")
	}
	tgt, _, err := sb.p.CreateTGT(sb.d)
	ok(t, err)
	if err := sb.p.TransitionQP(tgt, verbs.QPStateInit, l); err == nil {
		t.Errorf("RESET->INIT via a listener succeeded; cm_init_qp_init_attr gives EINVAL")
	}
}

// On a failed device a send never completes: posted (mlx5's post_send does
// not look at the internal error state) or waiting there for a receive, it
// gets no completion, not even a flush when its QP moves to ERR (the
// kernel simulates flushes for its own consumers only), and keeps its send
// queue slot, so that the queue fills. The model used to fail such sends with WCRetryExcErr, as to a node that is
// off, and flush them: completions a dead device never writes.
func TestModelFailedDeviceSendsNeverComplete(t *testing.T) {
	a, _, sa, k := sendWaitingForReceive(t, NodeConfig{SendQueueDepth: 8})
	a.FailDevice()
	var cs [8]kernel.SendCompletion
	noCompletion := func(when string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if n, err := sa.p.PollSend(ctx, k.ini, cs[:]); n != 0 || err == nil {
			t.Fatalf("%s: %+v %v; a failed device completes nothing", when, cs[:n], err)
		}
	}
	noCompletion("the send that waited for a receive")
	posted := 0
	for ; posted < 16; posted++ {
		err := sa.p.PostSend(k.ini, []kernel.SendWR{{WRID: uint64(10 + posted), RemoteSRQN: 1, Payload: []byte{3}}})
		if err != nil {
			if !isErrno(err, syscall.ENOMEM) {
				t.Fatalf("post %d on the failed device: %v, want success, then ENOMEM once the queue is full", posted, err)
			}
			break
		}
	}
	if posted != 7 { // depth 8, one slot held by the send that waited
		t.Fatalf("%d sends posted before the queue was full, want 7", posted)
	}
	noCompletion("posted sends")
	ok(t, sa.p.TransitionQP(k.ini, verbs.QPStateErr, k.aid))
	noCompletion("after the move to ERR")
}
