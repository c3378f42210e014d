package cm

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/goxrc/goxrc/rdmacm"
)

// FuzzPeerHello: the whole check of a framed peer's side of the CM exchange
// (private data and the read credit the CM reports). Accepted only with a
// read credit, zero padding, every field in range and a probe target that
// does not wrap; whatever is refused is refused as ErrProtocol.
func FuzzPeerHello(f *testing.F) {
	good := hello{queueDepth: 64, maxMessage: 4096, probe: probeTarget{addr: 1 << 40, rkey: 9}}.marshal()
	f.Add(append(good, make([]byte, 28)...), uint8(1))
	f.Add(good, uint8(0))
	f.Add(make([]byte, 196), uint8(4))
	f.Fuzz(func(t *testing.T, pd []byte, initiatorDepth uint8) {
		var ev rdmacm.Event
		ev.PrivateData, ev.Conn.InitiatorDepth = pd, initiatorDepth
		h, err := peerHello(ev)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("refused with %v, not ErrProtocol", err)
			}
			return
		}
		switch {
		case initiatorDepth == 0:
			t.Fatal("accepted a peer that grants no RDMA reads")
		case len(pd) < helloLen || !bytes.Equal(pd[:helloLen], h.marshal()):
			t.Fatalf("%x accepted as %+v", pd, h)
		case bytes.Count(pd[helloLen:], []byte{0}) != len(pd)-helloLen:
			t.Fatalf("non-zero padding accepted: %x", pd)
		case h.queueDepth < minQueueDepth || h.queueDepth > maxQueueDepth || int(h.queueDepth)+1 > maxFrameCredits:
			t.Fatalf("queue depth %d accepted", h.queueDepth)
		case h.maxMessage < minMessageSize || h.maxMessage > maxMessageSize:
			t.Fatalf("message size %d accepted", h.maxMessage)
		case h.probe.addr > math.MaxUint64-probeLen:
			t.Fatalf("wrapping probe target %#x accepted", h.probe.addr)
		}
	})
}
