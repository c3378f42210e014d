package xrc

import (
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// TestAcceptorRejectFields: the fields xrc-protocol.md ("Private data")
// gives a REJECT. Its tag is the REQ's conn tag where the acceptor read the
// REQ, and 0 where it answers without the REQ's fields: its endpoint
// closing (BUSY_RETRY), no XRC (NO_XRC), a REQ that did not decode
// (VERSION, BAD_REQUEST). Every REJECT carries the version range we speak
// and the rejecter's domain id, which TGT_GONE and DOMAIN_MISMATCH need
// (the dialer rebuilds only an uplink into that domain).
func TestAcceptorRejectFields(t *testing.T) {
	e := newEnv(t)
	check := func(what string, d decision, reason wire.RejectReason, tag uint32) {
		t.Helper()
		r := d.Reject
		switch {
		case d.Accept:
			t.Errorf("%s: accepted, want REJECT(%v)", what, reason)
		case r.Reason != reason || r.Tag != tag:
			t.Errorf("%s: REJECT(%v) tag %#x, want REJECT(%v) tag %#x", what, r.Reason, r.Tag, reason, tag)
		case r.MinVersion != wire.MinVersion || r.MaxVersion != wire.MaxVersion:
			t.Errorf("%s: versions %d..%d, want %d..%d", what, r.MinVersion, r.MaxVersion, wire.MinVersion, wire.MaxVersion)
		case r.DomainID != e.dom.ID:
			t.Errorf("%s: domain id %#x, want ours %#x", what, r.DomainID, e.dom.ID)
		}
		var got wire.Reject
		if err := wire.DecodeReject(d.PrivateData, &got); err != nil || got != r {
			t.Errorf("%s: REJECT encoded as %x (%v), decodes to %+v", what, d.PrivateData, err, got)
		}
		if len(d.PrivateData) > 2 && d.PrivateData[2] != 1 {
			t.Errorf("%s: REJECT header version %d, want 1 (frozen)", what, d.PrivateData[2])
		}
	}

	// Read: the conn tag comes back.
	_, u := e.phys(e.r1, nil)
	d, _ := e.phys(e.r1, func(r *wire.Req) { r.INIQPN++ }) // INI QPN differs from the CM's
	check("PHYS_REQ naming another INI than the CM's", d, wire.RejectBadRequest, e.tag)
	gone := e.virtReq(u)
	gone.TGTQPNHint = 0xFFFF // no such TGT
	d = e.virt(e.r2, gone)
	check("VIRT_REQ naming no TGT", d, wire.RejectTGTGone, gone.ConnTag)
	foreign := e.virtReq(u)
	foreign.DomainHint = e.dom.ID + 1
	d = e.virt(e.r2, foreign)
	check("VIRT_REQ into another domain", d, wire.RejectDomainMismatch, foreign.ConnTag)
	move := e.virtReq(u)
	move.Flags, move.Move = wire.FlagMove, 1
	d = e.virt(e.r2, move)
	check("MOVE of a leg never made", d, wire.RejectBadRequest, move.ConnTag)

	// Not read: tag 0.
	good := e.virtReq(u)
	b := make([]byte, wire.BudgetSIDRREQ)
	if _, err := good.Encode(b); err != nil {
		t.Fatal(err)
	}
	from := netip.AddrPortFrom(addrA, 1)
	ev := func(pd []byte) kernel.Event {
		return kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeSIDR, Remote: from, PrivateData: pd}
	}
	next := append([]byte(nil), b...)
	next[2] = wire.Version + 1
	check("next version", e.r2.acc.Decide(ev(next)), wire.RejectVersion, 0)
	bad := append([]byte(nil), b...)
	bad[42], bad[41] = 0, 0 // reply port 0
	check("reply port 0", e.r2.acc.Decide(ev(bad)), wire.RejectBadRequest, 0)

	p := e.f.AddNode(addrC, model.NodeConfig{NoXRC: true}).NewProcess()
	noXRC := newAcceptor(acceptorConfig{Kernel: p, DomainID: e.dom.ID})
	check("no XRC", noXRC.Decide(ev(b)), wire.RejectNoXRC, 0)

	e.r2.acc.Close()
	check("closing", e.r2.acc.Decide(ev(b)), wire.RejectBusyRetry, 0)
}
