package memfabric_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestProcessAfterPowerOffReachesNothing: a process started on a node
// after its PowerOff is alive (an engine starts and listens on it) but
// reaches nothing and is reached by nothing: Dials either way get no
// answer and end with their contexts, as PowerOff's doc says.
func TestProcessAfterPowerOffReachesNothing(t *testing.T) {
	f := memfabric.New()
	sp := f.Node("10.5.1.2").Process()
	defer sp.Kill()
	off := f.Node("10.5.1.1")
	off.PowerOff()
	p := off.Process()
	defer p.Kill()
	ctx := context.Background()
	srv, err := xrc.NewEndpoint(ctx, xrc.Config{Process: sp, Addr: "10.5.1.2:7000", DomainDir: t.TempDir() + "/s"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	e, err := xrc.NewEndpoint(ctx, xrc.Config{Process: p, Addr: "10.5.1.1:7000", DomainDir: t.TempDir() + "/p"})
	if err != nil {
		t.Fatalf("an endpoint on a process started after PowerOff: %v", err)
	}
	defer e.Close()
	for _, d := range []struct {
		name string
		from *xrc.Endpoint
		to   string
	}{{"from the powered-off node", e, "10.5.1.2:7000"}, {"to it", srv, "10.5.1.1:7000"}} {
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, err := d.from.Dial(dctx, d.to)
		cancel()
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Dial %s: %v, want no answer (context.DeadlineExceeded)", d.name, err)
		}
	}
}
