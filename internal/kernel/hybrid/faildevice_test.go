package hybrid

import (
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/kcm"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/verbs"
)

// Moving a QP to ERR or RESET works on a failed device (mlx5's 2ERR_QP and
// 2RST_QP return OK in its internal error state, QUERY_QP does not):
// hybrid's TransitionQP asked the model's QueryQP first, so a hybrid
// process could not move its INI to ERR (recover does) once its node's
// device failed (found by review; the real seam likewise).
func TestHybridErrOnFailedDevice(t *testing.T) {
	ip := netip.MustParseAddr("10.9.0.1")
	f := NewFabric(model.ReuseLIFO)
	m := f.Node(ip).NewProcess()
	ini, iniN, err := m.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	path := kcm.Path{RemoteQPN: toWire(0x55, QPNOffset), Remote: netip.AddrPortFrom(ip, 7), Exchange: kernel.ExchangeXRC}
	if err := f.withPath(m, kernel.QPInfo{Num: iniN, Type: verbs.QPTypeXRCSend}, path, func(id kernel.ID) error {
		return m.TransitionQP(ini, verbs.QPStateRTS, id)
	}); err != nil {
		t.Fatal(err)
	}
	p := &Process{f: f, off: f.offset(ip), m: m} // the CM half is not used by a move to ERR
	f.Node(ip).FailDevice()
	if err := p.TransitionQP(ini, verbs.QPStateErr, 0); err != nil {
		t.Errorf("hybrid TransitionQP(ERR) on a failed device: %v; the model's own rule says 2ERR works", err)
	}
	if err := m.TransitionQP(ini, verbs.QPStateErr, 0); err != nil {
		t.Errorf("model TransitionQP(ERR): %v", err)
	}
}
