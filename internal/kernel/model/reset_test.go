package model

import (
	"context"
	"errors"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Rule: a move to RESET drops the INI's send completions not yet polled and
// frees its whole send queue: every XRC provider's modify_qp cleans the QP's
// entries out of its CQs and resets the queue's indices after a successful
// move to RESET (mlx5_modify_qp: mlx5_cq_clean, mlx5_init_qp_indices;
// mlx4_modify_qp and hns_roce_u_v2_modify_qp alike), as the real seam's
// TransitionQP says where it empties its send ring. The model kept the
// completions: a poll after the reset returned the old connection's WRIDs,
// and they held send queue slots, so that the INI, moved up again through a
// new exchange, refused its first posts with ENOMEM.
func TestModelResetDropsSendCompletions(t *testing.T) {
	f := NewFabric(ReuseLIFO)
	a := f.AddNode(addrA, NodeConfig{SendQueueDepth: 2})
	b := f.AddNode(addrB, NodeConfig{})
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb, l)
	wr := func(id uint64) kernel.SendWR {
		return kernel.SendWR{WRID: id, RemoteSRQN: sb.srqn, Imm: uint32(id), Payload: []byte{byte(id)}}
	}
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{wr(1), wr(2)})) // completed, not polled
	ok(t, sa.p.TransitionQP(k.ini, verbs.QPStateReset, 0))

	var c [4]kernel.SendCompletion
	ctx, cancel := contextShort()
	n, err := sa.p.PollSend(ctx, k.ini, c[:])
	cancel()
	if n != 0 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("poll after RESET: %d %+v, %v; want nothing (the reset cleans the CQ)", n, c[:n], err)
	}

	// The same INI on a new connection (the old one torn down first, or
	// its stale-table entry would refuse the REQ).
	teardown(t, sa, sb, k)
	aid := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, k.iniQPN, nil))
	pid := event(t, sb.p, l, kernel.EventConnectRequest).ID
	tgt, tgtQPN, err := sb.p.CreateTGT(sb.d)
	ok(t, err)
	ok(t, sb.p.TransitionQP(tgt, verbs.QPStateRTR, pid))
	ok(t, sb.p.Accept(pid, tgtQPN, nil))
	event(t, sa.p, aid, kernel.EventConnectResponse)
	ok(t, sa.p.TransitionQP(k.ini, verbs.QPStateRTS, aid))
	ok(t, sa.p.Establish(aid))

	if err := sa.p.PostSend(k.ini, []kernel.SendWR{wr(3), wr(4)}); err != nil {
		t.Fatalf("posting a full queue's worth after RESET: %v, want the queue free", err)
	}
	n = must[int](t)(sa.p.PollSend(ctxT(t), k.ini, c[:]))
	if n != 2 || c[0].WRID != 3 || c[1].WRID != 4 {
		t.Fatalf("completions %+v, want 3 and 4 only", c[:n])
	}
	for _, want := range []uint32{1, 2, 3, 4} { // 1 and 2 arrived before the reset
		if r := recv(t, sb); r.Imm != want {
			t.Fatalf("received imm %d, want %d", r.Imm, want)
		}
	}
}
