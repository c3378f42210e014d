package xrc

import (
	"fmt"
	"net/netip"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// errSRQLiar fails a leg to (or from) a peer incarnation whose SRQ number
// proved to name no SRQ of its node: a leg of ours to it failed its first
// frame with "remote invalid request". An endpoint has one SRQ for its whole
// life, so that incarnation either ended (and never answers again: a new
// start draws a new random incarnation) or lied; one that answers again is
// alive, so it lied: a protocol violation.
var errSRQLiar = fmt.Errorf("%w: its incarnation named an SRQ number its node does not have (a leg's first frame failed \"remote invalid request\")", ErrProtocol)

// maxSRQLiars bounds the (node, incarnation, SRQ number) triples an
// endpoint refuses. Each was learned at the price of one uplink recovery,
// and one forgotten costs at most one more when it is dialed again; the
// peer picks its incarnation and number, so a liar that draws new ones per
// leg passes the list whatever its size (see docs/xrc-protocol.md).
var maxSRQLiars = 256 // a variable for tests

// srqLiar is what a failed first frame proves: at that node, that
// incarnation's SRQ number named nothing. The incarnation alone is what the
// peer claims, and any peer may claim an honest process's (it learned it
// from one of that process's requests or ACCEPTs): keyed on it alone, a
// process anywhere had an honest one refused
// (TestBogusSRQNImpersonatedIncarnationSparesHonestPeer). An honest
// incarnation's one SRQ number, at its own node, never fails a first frame.
type srqLiar struct {
	node netip.Addr
	inc  uint64
	srqn uint32
}

func srqLiarKey(node netip.Addr, inc uint64, srqn uint32) srqLiar {
	return srqLiar{rdmacm.CanonicalZone(node.Unmap()).WithZone(""), inc, srqn}
}

// srqLiarFirstFrameLocked records, from a send that failed "remote invalid
// request", that c's peer incarnation gave an SRQ number that never took a
// frame of ours: only a leg none of whose frames completed before (reached)
// proves that. A leg that was reached lost an SRQ that was there, which is
// what an honest receiver's death looks like, and says nothing of a lie.
func (e *Endpoint) srqLiarFirstFrameLocked(c *Conn) {
	if c.reached || !c.sendUp || c.peerInc == 0 {
		return
	}
	k := srqLiarKey(c.raddr.Addr(), c.peerInc, c.peerSRQN)
	if _, ok := e.srqLiars[k]; ok {
		return
	}
	if len(e.srqLiarOrder) >= maxSRQLiars {
		delete(e.srqLiars, e.srqLiarOrder[0])
		e.srqLiarOrder = append(e.srqLiarOrder[:0], e.srqLiarOrder[1:]...)
	}
	e.srqLiarOrder = append(e.srqLiarOrder, k)
	e.srqLiars[k] = struct{}{}
}

// srqLiarLocked reports whether srqn, named by incarnation inc at node,
// named nothing there (srqLiarFirstFrameLocked).
func (e *Endpoint) srqLiarLocked(node netip.Addr, inc uint64, srqn uint32) bool {
	_, ok := e.srqLiars[srqLiarKey(node, inc, srqn)]
	return ok
}

// srqLiarRequest reports whether ev asks for a new connection (no MOVE, no
// reciprocal leg, no ABORT) from an incarnation whose SRQ number named
// nothing at the requester's node, and its conn tag: our reverse leg to it
// would name that SRQ number again, and its first frame would fail our
// uplink to the node once more. MOVEs of its legs go on as before: they
// make no new leg of ours.
func (e *Endpoint) srqLiarRequest(ev kernel.Event) (uint32, bool) {
	e.mu.Lock()
	none := len(e.srqLiars) == 0
	e.mu.Unlock()
	if none {
		return 0, false
	}
	want := wire.TypePhysReq
	if ev.Exchange == kernel.ExchangeSIDR {
		want = wire.TypeVirtReq
	}
	var req wire.Req
	if wire.DecodeReq(ev.PrivateData, want, &req) != nil ||
		req.Flags&(wire.FlagMove|wire.FlagReciprocal|wire.FlagAbort) != 0 {
		return 0, false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return req.ConnTag, e.srqLiarLocked(ev.Remote.Addr(), req.Incarnation, req.SRQN)
}
