package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// holdOneMove holds the first MOVE to dst of the exchange ex (kernel.ExchangeSIDR:
// a VIRT_REQ; kernel.ExchangeXRC: a PHYS_REQ) once armed: it sends on held,
// then waits for release.
type holdOneMove struct {
	kernel.Kernel
	dst     netip.AddrPort
	ex      kernel.Exchange
	armed   chan struct{} // closed to arm; each arming holds one MOVE
	held    chan struct{}
	release chan struct{}
}

func (k *holdOneMove) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	var req wire.Req
	want := wire.TypeVirtReq
	if ex == kernel.ExchangeXRC {
		want = wire.TypePhysReq
	}
	if dst == k.dst && ex == k.ex && wire.DecodeReq(pd, want, &req) == nil && req.Flags&wire.FlagMove != 0 {
		select {
		case <-k.armed:
			select {
			case k.held <- struct{}{}:
				select {
				case <-k.release:
				case <-ctx.Done():
				}
			case <-ctx.Done():
			}
		default:
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// A dial rebuilt its uplink once (p's TGT_GONE), and asked again over the
// TGT the rebuild made while that recovery was still moving legs onto it.
// The TGT's creator (c) died before h's MOVE opened it, so p answered
// TGT_GONE for it, truthfully, as the recovery learnt from h's MOVE and
// began the next round. The refusal named the uplink's current TGT and
// refuted the uplink: h's healthy leg, moved by that next round, kept it
// beside the uplink the dial made. A refusal of a TGT the uplink is still
// settling onto, or knows broken, is no verdict on the uplink: the dial
// waits for the recovery and asks again.
func TestTGTGoneWhileSettlingDoesNotRefuteUplink(t *testing.T) {
	w := newWorld(t)
	const node = "10.0.238.2"
	g := newHoldDials(node + ":7001")
	vm := &holdOneMove{dst: netip.MustParseAddrPort(node + ":7002"), ex: kernel.ExchangeSIDR, armed: make(chan struct{}), held: make(chan struct{}), release: make(chan struct{})}
	pm := &holdOneMove{dst: vm.dst, ex: kernel.ExchangeXRC, armed: make(chan struct{}), held: make(chan struct{}), release: make(chan struct{})}
	s := w.wrappedEndpoint("10.0.238.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		pm.Kernel = k
		vm.Kernel = pm
		g.Kernel = vm
		return g
	}, longTimers)
	countedTags(s.Endpoint) // c's leg, made first, sorts first: it makes the new TGT
	c := w.endpoint(node, 7000, longTimers)
	var pk *refusingTGT
	p := w.wrappedEndpoint(node, 7001, refusingOnce(&pk), longTimers)
	h := w.endpoint(node, 7002, longTimers)
	pair(t, s, c)
	sh, hc := pair(t, s, h)
	ctx := ctxT(t, 20*time.Second)
	s.mu.Lock()
	u := sh.up
	s.mu.Unlock()
	pk.armed.Store(true)
	close(vm.armed)
	g.holds.Store(2)
	dialed := dialsBehind(ctx, s, p.Addr().String(), 1)
	await := func(ch chan struct{}, what string) {
		t.Helper()
		awaitBeforeDialEnds(t, ctx, ch, dialed, what)
	}
	await(g.held, "the dial's first VIRT_REQ")
	g.release <- struct{}{} // p refuses it TGT_GONE: the dial rebuilds u
	await(vm.held, "h's VIRT MOVE")
	await(g.held, "the dial's VIRT_REQ over the new TGT")
	c.p.Kill() // the new TGT's only holder: it dies
	close(pm.armed)
	g.release <- struct{}{} // TGT_GONE for u's current TGT, while u settles
	eventually(t, "p's second refusal", func() (bool, string) {
		n := p.Stats().Rejected
		return n >= 2, fmt.Sprint(n)
	})
	vm.release <- struct{}{} // h's MOVE refused TGT_GONE: the next round
	await(pm.held, "the next round's PHYS_REQ to h")
	pm.release <- struct{}{}
	res := <-dialed
	if res.err != nil {
		t.Fatalf("dial to p: %v", res.err)
	}
	defer res.c.Close()
	pc, err := p.Accept(ctx)
	if err != nil {
		t.Fatalf("accept on p: %v", err)
	}
	roundTrip(t, res.c, pc, []byte("p"))
	roundTrip(t, sh, hc, []byte("h"))
	s.mu.Lock()
	refuted := u.refuted
	s.mu.Unlock()
	if n, nref := liveUplinks(s.Endpoint, node); n != 1 || refuted {
		t.Fatalf("uplinks to %s: %d (%d refuted; h's refuted %v), want 1: h's is healthy", node, n, nref, refuted)
	}
}
