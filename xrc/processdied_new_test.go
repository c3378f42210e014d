package xrc

import (
	"errors"
	"testing"
	"time"
)

// An endpoint opened on a process that has died (memfabric's Kill, its
// node's PowerOff) fails for the process's death, as the calls of one
// that was running on it do: ErrProcessDied, not ErrClosed, which says the
// application closed something. NewEndpoint said "ibv_open_xrcd: use of
// closed network connection", the model's answer to a dead process's
// call, matching ErrClosed: cm's Dial on that process, which opens a new
// dialer endpoint once the old one died, then said ErrClosed where the
// same Dial a moment before, on the old endpoint, said ErrProcessDied.
func TestNewEndpointOnDeadProcessIsProcessDeath(t *testing.T) {
	w := newWorld(t)
	for _, how := range []string{"Kill", "PowerOff"} {
		ip := map[string]string{"Kill": "10.0.196.1", "PowerOff": "10.0.196.2"}[how]
		p := w.f.Node(ip).Process()
		if how == "Kill" {
			p.Kill()
		} else {
			w.f.Node(ip).PowerOff()
		}
		e, err := NewEndpoint(ctxT(t, 5*time.Second), Config{Process: p, Addr: ip + ":7000", DomainDir: t.TempDir() + "/goxrc"})
		if err == nil {
			e.Close()
			t.Fatalf("after %s: NewEndpoint succeeded on a dead process", how)
		}
		if errors.Is(err, ErrClosed) || !errors.Is(err, ErrProcessDied) {
			t.Errorf("NewEndpoint after its process's %s: %v; want ErrProcessDied, not ErrClosed", how, err)
		}
	}
}
