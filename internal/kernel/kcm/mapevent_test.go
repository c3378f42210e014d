package kcm

import (
	"bytes"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
)

// An ADDR_ERROR or ROUTE_ERROR after the request (the kernel turns a SIDR
// REP whose qkey it refuses into ADDR_ERROR) ends the exchange with its
// errno, as CONNECT_ERROR does; it was dropped, and the exchange waited
// for ever.
func TestLateResolutionErrorsEndTheExchange(t *testing.T) {
	c := &CM{ids: map[kernel.ID]*entry{}}
	for _, typ := range []rdmacm.EventType{rdmacm.EventAddrError, rdmacm.EventRouteError} {
		for _, ex := range []kernel.Exchange{kernel.ExchangeSIDR, kernel.ExchangeXRC} {
			ke, ok := c.mapEvent(1, &entry{ex: ex}, rdmacm.Event{Type: typ, Status: -22})
			if !ok || ke.Type != kernel.EventUnreachable || ke.Status != -22 {
				t.Errorf("%v on a %v exchange: %+v (passed on: %v), want UNREACHABLE with status -22", typ, ex, ke, ok)
			}
		}
	}
}

// FuzzMapEvent: whatever a CM event carries from the peer (private data of
// any length librdmacm reports, up to the message's budget; any QP number,
// qkey and status), mapEvent hands the engine what the model would: the
// private data copied and zero-padded to exactly the budget of the message
// it came in (REQ, SIDR REQ, REP, SIDR REP, REJ), none where that message
// carries none the engine reads; a 24-bit QP number (the REQ's INI, the
// REP's TGT, the SIDR REP's; ESTABLISHED of a connected exchange repeats
// the REP's); a refusal's or an unanswered request's status kept; and only
// the event types the seam knows passed on.
func FuzzMapEvent(f *testing.F) {
	f.Add(uint8(rdmacm.EventConnectRequest), false, uint32(0x1234567), uint32(0), int32(0), []byte("req"))
	f.Add(uint8(rdmacm.EventConnectRequest), true, uint32(0), uint32(0), int32(0), make([]byte, 180))
	f.Add(uint8(rdmacm.EventConnectResponse), false, uint32(0xFF000041), uint32(0), int32(0), make([]byte, 196))
	f.Add(uint8(rdmacm.EventEstablished), true, uint32(0x41), kernel.SIDRQKey, int32(0), []byte{1})
	f.Add(uint8(rdmacm.EventEstablished), false, uint32(0x41), uint32(0), int32(0), []byte{1})
	f.Add(uint8(rdmacm.EventRejected), true, uint32(0), uint32(0), int32(2), []byte("rej"))
	f.Add(uint8(rdmacm.EventRejected), false, uint32(0), uint32(0), int32(28), []byte("rej"))
	f.Add(uint8(rdmacm.EventUnreachable), true, uint32(0), uint32(0), int32(-110), []byte(nil))
	f.Add(uint8(rdmacm.EventDisconnected), false, uint32(0), uint32(0), int32(5), []byte(nil))
	f.Fuzz(func(t *testing.T, typ uint8, sidr bool, qpn, qkey uint32, status int32, pd []byte) {
		const mask = 0xFFFFFF
		ex := kernel.ExchangeXRC
		if sidr {
			ex = kernel.ExchangeSIDR
		}
		re := rdmacm.Event{Type: rdmacm.EventType(typ % 17), Status: int(status)}
		if sidr {
			re.UD = rdmacm.UDParam{QPNum: qpn, QKey: qkey}
		} else {
			re.Conn = rdmacm.ConnParam{QPNum: qpn}
		}
		if re.Type == rdmacm.EventConnectRequest {
			re.ID = &rdmacm.ID{} // the new passive id
		}
		// The message the event reports and its budget (0: none read).
		budget := 0
		switch re.Type {
		case rdmacm.EventConnectRequest:
			budget = rdmacm.MaxReqPrivateData
			if sidr {
				budget = rdmacm.MaxSIDRReqPrivateData
			}
		case rdmacm.EventConnectResponse:
			budget = rdmacm.MaxRepPrivateData
		case rdmacm.EventEstablished, rdmacm.EventUnreachable, rdmacm.EventConnectError:
			if sidr {
				budget = rdmacm.MaxSIDRRepPrivateData
			}
		case rdmacm.EventRejected:
			budget = rdmacm.MaxRejPrivateData
			if sidr {
				budget = rdmacm.MaxSIDRRepPrivateData
			}
		}
		if budget > 0 && len(pd) > budget {
			pd = pd[:budget] // the kernel reports no more
		}
		re.PrivateData = bytes.Clone(pd)
		c := &CM{ids: map[kernel.ID]*entry{}}
		const repTGT = 0x123
		e := &entry{ex: ex, remoteQPN: repTGT}
		ke, ok := c.mapEvent(1, e, re)
		known := map[rdmacm.EventType]kernel.EventType{
			rdmacm.EventConnectRequest: kernel.EventConnectRequest, rdmacm.EventConnectResponse: kernel.EventConnectResponse,
			rdmacm.EventEstablished: kernel.EventEstablished, rdmacm.EventRejected: kernel.EventRejected,
			rdmacm.EventUnreachable: kernel.EventUnreachable, rdmacm.EventConnectError: kernel.EventUnreachable,
			rdmacm.EventAddrError: kernel.EventUnreachable, rdmacm.EventRouteError: kernel.EventUnreachable,
			rdmacm.EventDisconnected: kernel.EventDisconnected, rdmacm.EventTimewaitExit: kernel.EventTimewaitExit,
		}
		want, isKnown := known[re.Type]
		if sidr && re.Type == rdmacm.EventRejected {
			want = kernel.EventUnreachable // a SIDR REP's refusal, as the model has it
		}
		if ok != isKnown {
			t.Fatalf("%v passed on: %v", re.Type, ok)
		}
		if !ok {
			return
		}
		if ke.Type != want || ke.Exchange != ex {
			t.Fatalf("%v on a %v exchange mapped to %v on %v", re.Type, ex, ke.Type, ke.Exchange)
		}
		if ke.QPNum > mask {
			t.Fatalf("%v: QP number %#x is not 24-bit", re.Type, ke.QPNum)
		}
		switch {
		case re.Type == rdmacm.EventConnectRequest && !sidr, re.Type == rdmacm.EventConnectResponse && !sidr:
			if ke.QPNum != qpn&mask {
				t.Fatalf("%v: QP number %#x, the peer's %#x", re.Type, ke.QPNum, qpn&mask)
			}
		case re.Type == rdmacm.EventEstablished && sidr:
			if ke.QPNum != qpn&mask || ke.QKey != qkey {
				t.Fatalf("SIDR REP: QP number %#x qkey %#x, the peer's %#x %#x", ke.QPNum, ke.QKey, qpn&mask, qkey)
			}
		case re.Type == rdmacm.EventEstablished:
			if ke.QPNum != repTGT {
				t.Fatalf("ESTABLISHED: QP number %#x, the REP's %#x", ke.QPNum, repTGT)
			}
		}
		switch want {
		case kernel.EventRejected, kernel.EventUnreachable:
			if ke.Status != int(status) {
				t.Fatalf("%v: status %d, the CM's %d", re.Type, ke.Status, status)
			}
		case kernel.EventConnectRequest, kernel.EventDisconnected, kernel.EventTimewaitExit:
			if ke.Status != 0 {
				t.Fatalf("%v: status %d", re.Type, ke.Status)
			}
		}
		if budget == 0 {
			if ke.PrivateData != nil && want != kernel.EventConnectResponse {
				t.Fatalf("%v on a %v exchange: private data %x where none is read", re.Type, ex, ke.PrivateData)
			}
		} else {
			if len(ke.PrivateData) != budget || !bytes.Equal(ke.PrivateData[:len(pd)], pd) ||
				!bytes.Equal(ke.PrivateData[len(pd):], make([]byte, budget-len(pd))) {
				t.Fatalf("%v on a %v exchange: private data %x for the peer's %x (budget %d)", re.Type, ex, ke.PrivateData, pd, budget)
			}
			if len(pd) > 0 && &ke.PrivateData[0] == &re.PrivateData[0] {
				t.Fatalf("%v: private data not copied", re.Type)
			}
		}
		if re.Type == rdmacm.EventConnectRequest {
			n := c.ids[ke.ID]
			if n == nil || !n.passive || n.ex != ex || (!sidr && n.remoteQPN != qpn&mask) {
				t.Fatalf("CONNECT_REQUEST: new id %v registered as %+v", ke.ID, n)
			}
		}
	})
}
