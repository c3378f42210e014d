package model

import (
	"bytes"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Rule: every private data the kernel delivers is its message's full
// budget, zero-padded. TestModelPrivateDataBudgets checks the padding of a
// REQ only (a REP and a SIDR REP there fill their budgets, a REJ's and a
// SIDR REQ's tails go unread), so a model padding REP, REJ or SIDR
// messages with anything but zeros passed it.
func TestModelPrivateDataZeroPadded(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := a.NewProcess(), b.NewProcess()
	lx := listen(t, pb, kernel.ExchangeXRC)
	lu := listen(t, pb, kernel.ExchangeSIDR)
	dst := addrPort(addrB)
	short := []byte{1, 2, 3}
	padded := func(what string, pd []byte, n int) {
		t.Helper()
		if len(pd) != n || !bytes.Equal(pd[:len(short)], short) || !allZero(pd[len(short):]) {
			t.Fatalf("%s: %d bytes %x, want %d: %x and zeros", what, len(pd), pd, n, short)
		}
	}
	// REP.
	c := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x100, short))
	req := event(t, pb, lx, kernel.EventConnectRequest)
	padded("REQ", req.PrivateData, 56)
	ok(t, pb.Accept(req.ID, 0x200, short))
	padded("REP", event(t, pa, c, kernel.EventConnectResponse).PrivateData, 196)
	// REJ.
	c = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeXRC, 0x101, nil))
	req = event(t, pb, lx, kernel.EventConnectRequest)
	ok(t, pb.Reject(req.ID, short))
	padded("REJ", event(t, pa, c, kernel.EventRejected).PrivateData, 148)
	// SIDR REQ, SIDR REP.
	s := must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, short))
	req = event(t, pb, lu, kernel.EventConnectRequest)
	padded("SIDR REQ", req.PrivateData, 180)
	ok(t, pb.Accept(req.ID, 0x300, short))
	padded("SIDR REP", event(t, pa, s, kernel.EventEstablished).PrivateData, 136)
	// SIDR reject.
	s = must[kernel.ID](t)(pa.Connect(ctxT(t), dst, kernel.ExchangeSIDR, 0, nil))
	req = event(t, pb, lu, kernel.EventConnectRequest)
	ok(t, pb.Reject(req.ID, short))
	padded("SIDR reject", event(t, pa, s, kernel.EventUnreachable).PrivateData, 136)
}
