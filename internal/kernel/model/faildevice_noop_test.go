package model

import (
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// On a failed device a move up to the state the QP is in fails with EIO
// too: the real seam asks the state first (QUERY_QP, which mlx5 fails in
// its internal error state), and the kernel's own same-state moves
// (INIT2INIT, RTS2RTS) are firmware commands. The model answered nil, as if
// the device still worked.
func TestModelFailedDeviceSameStateMove(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb, l)
	a.FailDevice()
	if err := sa.p.TransitionQP(k.ini, verbs.QPStateRTS, k.aid); !isErrno(err, syscall.EIO) {
		t.Fatalf("RTS to RTS on a failed device: %v, want EIO", err)
	}
	if _, err := sa.p.QueryQP(k.ini); !isErrno(err, syscall.EIO) {
		t.Fatalf("QueryQP on a failed device: %v, want EIO", err)
	}
}
