package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// FuzzEndpointRequest sends an endpoint that holds a sender's TGT any
// connection request a stranger can make up: any private data, on the
// physical (XRC-typed) or the virtual (SIDR) exchange, from a process with
// an INI of its own. Whatever it is, the endpoint answers (an accept or a
// reject: nothing hangs or panics), and once the stranger has gone, and a
// half-made connection has met the handshake timeout, it holds what it held
// before: no TGT handle, local count, downlink, connection or QP more, no
// goroutine more (newWorld checks), and its honest connection still works.
// With linger, the stranger stays after destroying its id (the endpoint
// must let go on its own); with fixINI, pd gets the stranger's real INI QP
// number where a REQ has it (unknown to the seeds), so that requests can be
// accepted too.
// TestEndpointHostileRequests checks the reject reasons of the seeds.
func FuzzEndpointRequest(f *testing.F) {
	virt := wire.Req{Type: wire.TypeVirtReq, ConnTag: 77, Incarnation: 0xE71, INIQPN: 0x40, TGTQPNHint: 0x40, DomainHint: 2, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
	phys := wire.Req{Type: wire.TypePhysReq, ConnTag: 78, Incarnation: 0xE71, INIQPN: 0x40, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
	enc := func(r wire.Req, f func(*wire.Req)) []byte {
		f(&r)
		b := make([]byte, wire.BudgetSIDRREQ)
		n, err := r.Encode(b)
		if err != nil {
			panic(err)
		}
		return b[:n]
	}
	same := func(*wire.Req) {}
	f.Add(true, true, false, []byte(nil))
	f.Add(true, true, false, []byte("\x13\x37 not our private data"))
	f.Add(true, true, false, enc(virt, same))
	f.Add(true, true, false, enc(virt, same)[:30])
	f.Add(true, true, false, enc(virt, func(r *wire.Req) { r.TGTQPNHint, r.DomainHint = 0x41, 3 }))
	f.Add(true, true, false, enc(virt, func(r *wire.Req) { r.Flags, r.Move = wire.FlagMove, 1 }))
	f.Add(true, true, false, enc(phys, same))
	f.Add(true, false, false, enc(virt, func(r *wire.Req) { // an ABORT naming no dial of ours
		r.Flags, r.PeerTag, r.INIQPN, r.TGTQPNHint, r.DomainHint = wire.FlagReciprocal|wire.FlagAbort, 4242, 0, 0, 0
	}))
	f.Add(false, true, false, enc(phys, same))
	f.Add(false, true, false, enc(phys, func(r *wire.Req) { r.Flags, r.PeerTag = wire.FlagReciprocal, 4242 }))
	f.Add(false, true, false, enc(virt, same))
	f.Add(false, true, false, []byte{wire.Version})
	f.Add(false, false, false, enc(phys, same))
	f.Add(false, true, true, enc(phys, same)) // accepted; the RTU never comes
	f.Add(true, true, true, enc(virt, same))
	const handshake = 300 * time.Millisecond
	short := func(c *Config) { c.HandshakeTimeout = handshake }
	f.Fuzz(func(t *testing.T, sidr, fixINI, linger bool, pd []byte) {
		ex, budget := kernel.ExchangeXRC, wire.BudgetREQ
		if sidr {
			ex, budget = kernel.ExchangeSIDR, wire.BudgetSIDRREQ
		}
		if len(pd) > budget {
			t.Skip("over the carrier's budget: the kernel refuses it (TestEndpointHostileRequests)")
		}
		w := newWorld(t)
		s := w.endpoint("10.0.9.1", 7000, short)
		r := w.endpoint("10.0.9.2", 7001, short)
		sc, rc := pair(t, s, r)
		stranger := w.rawKernel("10.0.9.3")
		_, iniQPN, err := stranger.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		if fixINI && len(pd) >= 27 {
			pd = append([]byte(nil), pd...)
			pd[24], pd[25], pd[26] = byte(iniQPN>>16), byte(iniQPN>>8), byte(iniQPN) // the REQ's INI QPN
		}
		nodeR := w.f.Node("10.0.9.2")
		snapshot := func() string {
			st := r.Stats()
			st.Rejected, st.Dropped, st.VirtReqs = 0, 0, 0
			return fmt.Sprintf("%+v node %+v", st, nodeR.Stats())
		}
		before := snapshot()
		ev := answer(t, stranger, r.Addr(), ex, iniQPN, pd) // destroys its id
		t.Logf("answered: %v, status %d", ev.Type, ev.Status)
		stranger.Close() // and goes, INI and all
		eventuallyWithin(t, handshake+3*time.Second, "the endpoint holds what it held", func() (bool, string) {
			got := snapshot()
			return got == before, got + "\nwas\n" + before
		})
		roundTrip(t, sc, rc, []byte("unaffected"))
		roundTrip(t, rc, sc, []byte("unaffected"))
	})
}
