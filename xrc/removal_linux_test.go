//go:build linux && cgo

package xrc

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel/hybrid"
	"github.com/goxrc/goxrc/test/softroce"
)

const removalDev = "rxerm1"

var removalVeth = softroce.VethPair{Name: "vethrm2", Peer: "vethrm3",
	Addr: netip.MustParsePrefix("10.80.0.1/24"), PeerAddr: netip.MustParsePrefix("10.80.0.2/24")}

// removalChildEnv makes TestHybridDeviceRemoval run its checks (see there).
const removalChildEnv = "GOXRC_REMOVAL_CHILD"

// TestHybridDeviceRemoval removes the soft-RoCE device under two endpoints
// on the hybrid seam (the real kernel CM, the model's QPs), with a
// connection between them and Accept and Recv waiting, and checks that the
// calls fail and that the endpoints let go of every CM id on their own: the
// test closes nothing until they have. The device is one of the test's own,
// on a veth pair of its own, so rxe0 stays. The checks run in a child
// process (this test binary again): librdmacm keeps its context on the
// device until the process exits, and soft-RoCE's removal waits for that,
// so the removal completes when the child exits, which the parent checks.
// Port 20318.
func TestHybridDeviceRemoval(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	if os.Getenv(removalChildEnv) != "" {
		removalChild(t)
		return
	}
	if _, err := softroce.Setup(removalDev, removalVeth); err != nil {
		t.Fatal(err)
	}
	child := exec.Command(os.Args[0], "-test.run=^TestHybridDeviceRemoval$", "-test.v", "-test.timeout=120s")
	child.Env = append(os.Environ(), removalChildEnv+"=1")
	out, err := child.CombinedOutput()
	t.Logf("child:\n%s", softroce.ChildOutput(out))
	if err != nil || !strings.Contains(string(out), "--- PASS: TestHybridDeviceRemoval") {
		t.Fatalf("the child's checks failed: %v", err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ls, err := softroce.Links()
		if err == nil && !slices.ContainsFunc(ls, func(l softroce.Link) bool { return l.Name == removalDev }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rdma link delete %s did not finish after the process on it exited", removalDev)
		}
	}
	if err := softroce.DeleteVeth(removalVeth.Name); err != nil {
		t.Error(err)
	}
}

func removalChild(t *testing.T) {
	ip := removalVeth.Addr.Addr()
	dir := t.TempDir() + "/goxrc"
	cfg := Config{DomainDir: dir, Heartbeat: 50 * time.Millisecond, IdleTimeout: 5 * time.Second, HandshakeTimeout: 10 * time.Second}
	var procs []*hybrid.Process
	open := func(port uint16) *Endpoint {
		p, err := hybridFabric().NewProcess(ip)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		procs = append(procs, p)
		c := cfg
		c.Addr = netip.AddrPortFrom(ip, port).String()
		e, err := newEndpoint(context.Background(), p, c)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	srv, cli := open(20318), open(20328)
	ctx := ctxT(t, 90*time.Second)
	dialed, err := cli.Dial(ctx, srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	accepted, err := srv.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if err := dialed.Send(ctx, []byte("before")); err != nil {
		t.Fatal(err)
	}
	if n, err := accepted.Recv(ctx, buf); err != nil || string(buf[:n]) != "before" {
		t.Fatalf("Recv = %q, %v", buf[:n], err)
	}

	type result struct {
		what string
		err  error
	}
	results := make(chan result, 3)
	go func() {
		_, err := srv.Accept(ctx)
		results <- result{"Accept", err}
	}()
	for what, c := range map[string]*Conn{"dialer's Recv": dialed, "acceptor's Recv": accepted} {
		go func() {
			_, err := c.Recv(ctx, make([]byte, 64))
			results <- result{what, err}
		}()
	}

	// The removal runs in a process of its own, which finishes after this
	// one exits (a thread waiting for that in the kernel could not be
	// interrupted, and would keep this process from exiting).
	if err := exec.Command("rdma", "link", "delete", removalDev).Start(); err != nil {
		t.Fatal(err)
	}
	// A connection may learn first that its peer's side went (the kernel
	// takes the ids one at a time, and both endpoints are on the device);
	// Accept can only learn of the removal, and so can the endpoints.
	for range 3 {
		select {
		case r := <-results:
			switch {
			case errors.Is(r.err, ErrDeviceRemoved):
			case r.what == "Accept" || !errors.Is(r.err, ErrPeerGone):
				t.Errorf("%s: %v, want ErrDeviceRemoved", r.what, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiting call did not return after the device was removed")
		}
	}
	// Every CM id of both processes is gone (spares included) before
	// anything was closed.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ids, spares := 0, 0
		for _, p := range procs {
			ready, _ := p.Spares()
			ids, spares = ids+p.Len(), spares+ready
		}
		if ids == 0 && spares == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d CM ids and %d spare ids left after the device was removed", ids, spares)
		}
	}
	if err := dialed.Send(ctx, []byte("after")); !errors.Is(err, ErrDeviceRemoved) && !errors.Is(err, ErrPeerGone) {
		t.Errorf("Send after the removal: %v, want ErrDeviceRemoved or ErrPeerGone", err)
	}
	if _, err := cli.Dial(ctx, srv.Addr().String()); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("Dial after the removal: %v, want ErrDeviceRemoved", err)
	}
	for _, e := range []*Endpoint{srv, cli} {
		if err := e.Close(); err != nil {
			t.Errorf("Close after the removal: %v", err)
		}
	}
}
