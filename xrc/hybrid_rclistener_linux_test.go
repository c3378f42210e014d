//go:build linux && cgo

package xrc

import (
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// An XRC dial to a port where only an RC listener (RDMA_PS_TCP, as cm's and
// most librdmacm servers') listens, through the real kernel CM: the
// physical request, XRC-typed in RDMA_PS_IB, matches no listener of its
// port space, so it is refused as NO_LISTENER (CM status 8, invalid
// service id), not with facts.md's QP-type reject (status 28, which is
// for a listener of another QP type in the same port space). cm's
// XRCPrefer Dial keys on this to retry over RC (cm/xrcfallback.go). Once
// an uplink to the RC listener's node is up (an XRC endpoint there, on
// another port), the dial is a SIDR request in RDMA_PS_UDP, which no
// listener of that port space takes either: SIDR status 1 (unsupported),
// NO_LISTENER too, and no new uplink.
func TestHybridDialRCListenerRefused(t *testing.T) {
	checkGoroutines(t)
	cli, _ := seamEndpoint(t, hybridSeam, 20351, t.TempDir()+"/goxrc")
	ip2 := softroce.SecondAddress(t, os.Getenv("RXE_DEV"), cli.Addr().Addr())
	srv, _ := seamEndpoint(t, hybridSeam, 20353, t.TempDir()+"/goxrc", func(c *Config) {
		c.Addr = netip.AddrPortFrom(ip2, 20353).String()
	})
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	l, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	rc := netip.AddrPortFrom(ip2, 20352)
	if err := l.Bind(rc); err != nil {
		t.Fatal(err)
	}
	if err := l.Listen(4); err != nil {
		t.Fatal(err)
	}
	refused := func(status int) {
		t.Helper()
		_, err := cli.Dial(ctxT(t, 20*time.Second), rc.String())
		var rj *RejectError
		if !errors.As(err, &rj) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("XRC dial to an RC listener: %v, want a refusal", err)
		}
		t.Logf("refused: %v", err)
		if rj.Reason != RejectNoListener || rj.Status != status {
			t.Errorf("reason %v, CM status %d; want NO_LISTENER, %d", rj.Reason, rj.Status, status)
		}
		if n := l.Pending(); n != 0 {
			t.Errorf("the RC listener got %d events, want none", n)
		}
	}
	refused(8) // a physical request: no uplink to ip2 yet

	c, s := pair(t, &proc{Endpoint: cli}, &proc{Endpoint: srv})
	roundTrip(t, c, s, []byte("over the uplink"))
	refused(1) // a virtual request over that uplink
	if st := cli.Stats(); st.Uplinks != 1 || st.VirtReqs != 1 {
		t.Errorf("client %+v: want one uplink, one VIRT_REQ (the refused one)", st)
	}
}
