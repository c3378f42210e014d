//go:build linux && cgo

package xrc

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// An XRC dial to a port where only an RC listener (RDMA_PS_TCP, as cm's and
// most librdmacm servers') listens, through the real kernel CM: the
// physical request, XRC-typed in RDMA_PS_IB, matches no listener of its
// port space, so it is refused as NO_LISTENER (CM status 8, invalid
// service id), not with facts.md's QP-type reject (status 28, which is
// for a listener of another QP type in the same port space). cm's
// XRCPrefer Dial keys on this to retry over RC (cm/xrcfallback.go).
func TestHybridDialRCListenerRefused(t *testing.T) {
	checkGoroutines(t)
	dir := t.TempDir() + "/goxrc"
	cli, _ := seamEndpoint(t, hybridSeam, 20351, dir)
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
	rc := netip.AddrPortFrom(cli.Addr().Addr(), 20352)
	if err := l.Bind(rc); err != nil {
		t.Fatal(err)
	}
	if err := l.Listen(4); err != nil {
		t.Fatal(err)
	}
	_, err = cli.Dial(ctxT(t, 20*time.Second), rc.String())
	var rj *RejectError
	if !errors.As(err, &rj) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("XRC dial to an RC listener: %v, want a refusal", err)
	}
	t.Logf("refused: %v", err)
	if rj.Reason != RejectNoListener || rj.Status != 8 {
		t.Errorf("reason %v, CM status %d; want NO_LISTENER, 8", rj.Reason, rj.Status)
	}
	if n := l.Pending(); n != 0 {
		t.Errorf("the RC listener got %d events, want none", n)
	}
}
