package xrc

import (
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// decisionRows returns the rows of xrc-protocol.md's table "The acceptor's
// decision".
func decisionRows(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../docs/xrc-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## The acceptor's decision")
	end := strings.Index(doc, "## Teardown")
	if start < 0 || end < start {
		t.Fatal("docs/xrc-protocol.md: no section \"The acceptor's decision\"")
	}
	var rows []string
	for _, l := range strings.Split(doc[start:end], "\n") {
		if strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| incoming") {
			rows = append(rows, l)
		}
	}
	return rows
}

// hasRow reports whether some row holds every one of words.
func hasRow(rows []string, words ...string) bool {
	for _, r := range rows {
		all := true
		for _, w := range words {
			all = all && strings.Contains(r, w)
		}
		if all {
			return true
		}
	}
	return false
}

// TestDecisionTableStatesRefusalsTheAcceptorMakes: two refusals the
// acceptor makes, each made here, and the row of the decision table that
// must state it (a reject the document does not list is a defect of the
// document: read as written, its rows say otherwise).
//
// A request naming a leg we hold (its sender's incarnation and tag) from
// another node than the leg's is refused BAD_REQUEST, whatever it is: a
// MOVE by PHYS_REQ or VIRT_REQ, a repeated PHYS_REQ, a retransmission
// (acceptor.foreignLeg, TestEndpointLegOfAnotherNode). The table said a
// PHYS_REQ MOVE of a known leg creates a TGT and moves the leg, a repeated
// PHYS_REQ releases the first answer, and a VIRT_REQ with the leg's TGT, INI
// and generation gets the cached ACCEPT, with no word of the node, the rule
// that keeps a process on a third node from taking a leg over.
//
// A PHYS_REQ whose TGT our kernel cannot make (CreateTGT, or its move to
// RTS, fails) is refused BUSY_RETRY with the errno as the REJECT's detail,
// nothing left behind (acceptor.kernelReject). The table had no row for it.
func TestDecisionTableStatesRefusalsTheAcceptorMakes(t *testing.T) {
	rows := decisionRows(t)

	t.Run("leg of another node", func(t *testing.T) {
		e := newEnv(t)
		d, _ := e.phys(e.r1, nil)
		wantAccept(t, d)
		leg := d.Leg
		e.sender = e.f.AddNode(addrC, model.NodeConfig{}).NewProcess() // a third node
		_, tgts := e.b.QPCount()
		dl := leg.Downlink
		d, _ = e.phys(e.r1, func(r *wire.Req) { r.ConnTag, r.Flags, r.Move = leg.PeerTag, wire.FlagMove, 1 })
		wantReject(t, d, wire.RejectBadRequest)
		d, _ = e.phys(e.r1, func(r *wire.Req) { r.ConnTag = leg.PeerTag })
		wantReject(t, d, wire.RejectBadRequest)
		if _, n := e.b.QPCount(); e.r1.acc.legs[legKey{senderInc, leg.PeerTag}] != leg || leg.Downlink != dl || n != tgts {
			t.Fatalf("a request from another node changed the leg (on %p, was %p) or made a TGT (%d, were %d)", leg.Downlink, dl, n, tgts)
		}
		e.expect(dl.TGTQPN, 1, 1, 0)
		if !hasRow(rows, "another node than the leg's", "REJECT(BAD_REQUEST)", "TestEndpointLegOfAnotherNode") {
			t.Error("docs/xrc-protocol.md: no row of the decision table refuses a request naming a known leg " +
				"from another node than the leg's (REJECT(BAD_REQUEST), TestEndpointLegOfAnotherNode)")
		}
	})

	t.Run("our kernel fails", func(t *testing.T) {
		e := newEnv(t)
		k := &failTGT{wrapper: wrapper{e.r1.p}}
		k.armed.Store(true)
		e.r1.acc = newAcceptor(acceptorConfig{Kernel: k, XRCD: e.r1.d, DomainID: e.dom.ID, Incarnation: 1, SRQN: e.r1.srqn, Credits: 8})
		d, _ := e.phys(e.r1, nil)
		wantReject(t, d, wire.RejectBusyRetry)
		if d.Reject.Detail != uint32(syscall.ENOMEM) || d.Reject.Tag != e.tag {
			t.Fatalf("REJECT %+v, want detail ENOMEM and the REQ's tag", d.Reject)
		}
		if _, n := e.b.QPCount(); e.r1.acc.LocalCounts() != 0 || e.r1.acc.Downlinks() != 0 || n != 0 {
			t.Fatalf("the refusal left a leg, a downlink or a TGT (%d)", n)
		}
		if !hasRow(rows, "CreateTGT", "REJECT(BUSY_RETRY") {
			t.Error("docs/xrc-protocol.md: no row of the decision table refuses a PHYS_REQ whose CreateTGT fails " +
				"(REJECT(BUSY_RETRY), the errno as detail)")
		}
	})
}
