package xrc

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// xrc-protocol.md, "ACCEPT REVERSE (only in answer to a ONE_EXCHANGE
// VIRT_REQ; a dialer refuses it otherwise ...)": a VIRT exchange answered
// with a well-formed ACCEPT flagged REVERSE fails with ErrProtocol when its
// request did not ask for one (a reciprocal request, a MOVE, a dial's second
// attempt), and is taken when it did. TestDialRefusesAcceptNotAnsweringIt
// covers the PHYS exchange only (a dial's VIRT_REQ always asks).
func TestVirtLinkRefusesUnaskedReverse(t *testing.T) {
	w := newWorld(t)
	e := w.endpoint("10.0.212.1", 7000)
	k := w.rawKernel("10.0.212.2")
	peer := netip.MustParseAddrPort("10.0.212.2:7000")
	l, err := k.Listen(peer, kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	// The raw peer answers each SIDR REQ with an ACCEPT that answers it
	// (tag, hinted TGT and domain) and carries a REVERSE section.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		for {
			ev, err := k.Event(ctx, l)
			if err != nil {
				return
			}
			var req wire.Req
			if wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &req) != nil {
				k.Reject(ev.ID, nil)
				continue
			}
			acc := wire.Accept{Flags: wire.AcceptReverse, TagEcho: req.ConnTag, AcceptorTag: 9, Incarnation: 9,
				TGTQPN: req.TGTQPNHint, SRQN: 9, DomainID: req.DomainHint, Credits: 8, MaxMessage: 64,
				Rev: wire.Reverse{Tag: 9, INIQPN: 2, TGTQPN: 2, DomainID: req.DomainHint}}
			b := make([]byte, wire.BudgetSIDRREP)
			n, err := acc.Encode(b)
			if err != nil {
				panic(err)
			}
			k.Accept(ev.ID, req.TGTQPNHint, b[:n])
			k.DestroyID(ev.ID)
		}
	}()
	for _, c := range []struct {
		name  string
		flags wire.Flags
		peer  uint32
		move  uint32
		taken bool
	}{
		{"ONE_EXCHANGE", wire.FlagOneExchange, 5, 0, true},
		{"plain (a dial's second attempt)", 0, 0, 0, false},
		{"RECIPROCAL", wire.FlagReciprocal, 5, 0, false},
		{"MOVE", wire.FlagMove, 0, 1, false},
	} {
		req := wire.Req{Type: wire.TypeVirtReq, Flags: c.flags, ConnTag: 77, PeerTag: c.peer, Incarnation: 1, INIQPN: 0x40,
			TGTQPNHint: 0x41, DomainHint: 0xD0, SRQN: 1, ReplyPort: 7000, Credits: 8, MaxMessage: 64, Move: c.move}
		_, err := e.virtLink(ctxT(t, 5*time.Second), peer, &req)
		switch {
		case c.taken && err != nil:
			t.Errorf("%s: REVERSE asked for and refused: %v", c.name, err)
		case !c.taken && !errors.Is(err, ErrProtocol):
			t.Errorf("%s: unasked REVERSE: %v, want ErrProtocol", c.name, err)
		}
	}
}
