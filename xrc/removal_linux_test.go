//go:build linux && cgo

package xrc

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/goxrc/goxrc/test/softroce"
)

// TestHybridDeviceRemoval removes the soft-RoCE device under two endpoints
// on the hybrid seam (the real kernel CM, the model's QPs), with a
// connection between them and Accept and Recv waiting. The kernel's removal
// waits until no process holds a context on the device (rxe cannot take
// one away), so it completes only if the endpoints let go of their CM ids
// on their own: the test closes nothing until it has. The device is one of
// the test's own, on a veth pair of its own, so rxe0 stays. Port 20318.
func TestHybridDeviceRemoval(t *testing.T) {
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	const dev = "rxerm1"
	veth := softroce.VethPair{Name: "vethrm2", Peer: "vethrm3",
		Addr: netip.MustParsePrefix("10.80.0.1/24"), PeerAddr: netip.MustParsePrefix("10.80.0.2/24")}
	if _, err := softroce.Setup(dev, veth); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { softroce.DeleteVeth(veth.Name) })
	ip := veth.Addr.Addr()
	dir := t.TempDir() + "/goxrc"
	cfg := Config{DomainDir: dir, Heartbeat: 50 * time.Millisecond, IdleTimeout: 5 * time.Second, HandshakeTimeout: 10 * time.Second}
	open := func(port uint16) *Endpoint {
		p, err := hybridFabric().NewProcess(ip)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
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

	// The removal runs in a process of its own: a thread waiting in the
	// kernel for this process to let go could not be interrupted.
	del := exec.Command("rdma", "link", "delete", dev)
	start := time.Now()
	if err := del.Start(); err != nil {
		t.Fatal(err)
	}
	deleted := make(chan error, 1)
	go func() { deleted <- del.Wait() }()
	select {
	case err := <-deleted:
		if err != nil {
			t.Fatalf("rdma link delete %s: %v", dev, err)
		}
		t.Logf("rdma link delete %s finished in %v", dev, time.Since(start))
	case <-time.After(60 * time.Second):
		t.Fatalf("rdma link delete %s did not finish in 60 s: the endpoints kept CM ids on the device (it ends when this process exits)", dev)
	}
	for range 3 {
		select {
		case r := <-results:
			if !errors.Is(r.err, ErrDeviceRemoved) {
				t.Errorf("%s: %v, want ErrDeviceRemoved", r.what, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a waiting call did not return after the device was removed")
		}
	}
	if err := dialed.Send(ctx, []byte("after")); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("Send after the removal: %v, want ErrDeviceRemoved", err)
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
