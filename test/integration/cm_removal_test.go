//go:build linux && cgo

package integration

import (
	"context"
	"errors"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
)

// removalVeth carries the soft-RoCE device that TestCMDeviceRemoval removes:
// a pair of its own, so the other tests' rxe0 stays.
var removalVeth = softroce.VethPair{
	Name:     "vethrm0",
	Peer:     "vethrm1",
	Addr:     netip.MustParsePrefix("10.79.0.1/24"),
	PeerAddr: netip.MustParsePrefix("10.79.0.2/24"),
}

const removalDev = "rxerm0"

// TestCMDeviceRemoval removes the RDMA device under a listener and under
// connections with calls blocked on both sides. The kernel's removal (rdma
// link delete) waits until no process holds a context on the device, and
// rxe cannot take contexts away from a process (it has no
// disassociate_ucontext), so the removal completes only if cm lets go of
// the device on its own: the test closes nothing until it has.
func TestCMDeviceRemoval(t *testing.T) {
	_, otherIP := softroce.Device(t) // rxe0's address; skips off the VM
	_, err := softroce.Setup(removalDev, removalVeth)
	require.NoError(t, err)
	t.Cleanup(func() {
		// Nothing of this process is on the device any more; librdmacm
		// still holds a context on it until it reads the device list.
		if deleteLink(removalDev, 60*time.Second, true) == nil {
			softroce.DeleteVeth(removalVeth.Name)
		}
	})
	ip := removalVeth.Addr.Addr()
	base := baseline(t, ip)
	ctx := cmCtx(t, 120*time.Second)
	// A listener on every device, which must outlive the removal of one.
	wild, err := cm.Listen(ctx, "0.0.0.0:0")
	require.NoError(t, err)
	t.Cleanup(func() { wild.Close() })
	anyPort := wild.Addr().(cm.Addr).Port()
	withWild := takeSnapshot()

	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	const n = 3
	var clients, servers []*cm.Conn
	for range n {
		c, s := connectAndSend(t, ctx, l, l.Addr().String(), "before")
		clients, servers = append(clients, c), append(servers, s)
	}

	// Calls that block until the device goes: a Recv on every connection,
	// both ends, and an Accept.
	type result struct {
		what string
		err  error
	}
	results := make(chan result, 2*n+1)
	for i := range n {
		for _, c := range []*cm.Conn{clients[i], servers[i]} {
			go func() {
				_, err := c.Recv(ctx, make([]byte, 256))
				results <- result{"Recv on " + c.LocalAddr().String(), err}
			}()
		}
	}
	go func() {
		_, err := l.Accept(ctx)
		results <- result{"Accept", err}
	}()

	start := time.Now()
	require.NoError(t, deleteLink(removalDev, 60*time.Second, false),
		"the kernel waits for this process to close its context on the device: cm kept something on it")
	t.Logf("rdma link delete %s finished in %v", removalDev, time.Since(start))

	for range 2*n + 1 {
		select {
		case r := <-results:
			require.ErrorIs(t, r.err, cm.ErrDeviceRemoved, "%s: %v", r.what, r.err)
			if r.what != "Accept" {
				require.ErrorIs(t, r.err, cm.ErrPeerGone, "%s: %v", r.what, r.err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a blocked call did not return after the device was removed")
		}
	}
	// Released before anything was closed: no verbs object, CM id or
	// connection is left (the removal above could not have completed
	// otherwise), and no goroutine.
	requireRemoved(t, withWild, 10*time.Second)

	// The listener on every device still serves the others.
	c, s := connectAndSend(t, ctx, wild, netip.AddrPortFrom(otherIP, anyPort).String(), "other")
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, wild.Close())

	// Calls after the removal fail the same way; Close still works.
	require.ErrorIs(t, clients[0].Send(ctx, []byte("after")), cm.ErrDeviceRemoved)
	for i := range n {
		require.NoError(t, clients[i].Close())
		require.NoError(t, servers[i].Close())
	}
	require.NoError(t, l.Close())
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, cm.ErrDeviceRemoved)

	// The device added again under the same name is a new device: a new
	// listener and dialer use it.
	require.NoError(t, softroce.AddLink(removalDev, removalVeth.Name))
	l, err = cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	c, s = connectAndSend(t, ctx, l, l.Addr().String(), "again")
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, l.Close())
	requireRemoved(t, base, 10*time.Second)
}

// connectAndSend dials addr, takes the connection from l and sends msg over
// it.
func connectAndSend(t *testing.T, ctx context.Context, l *cm.Listener, addr, msg string) (dialed, accepted *cm.Conn) {
	t.Helper()
	c, err := cm.Dial(ctx, addr, cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Send(ctx, []byte(msg)))
	buf := make([]byte, 256)
	k, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf[:k]))
	return c, s
}

// deleteLink removes the RDMA link name and waits up to d for the kernel to
// finish, calling rdmacm.RefreshDevices meanwhile if refresh is set. The
// removal runs in a process of its own (`rdma link delete`): a thread
// waiting in the kernel for this process to let go of the device cannot be
// interrupted, and would keep this process from exiting, and so from
// letting go, for ever.
func deleteLink(name string, d time.Duration, refresh bool) error {
	cmd := exec.Command("rdma", "link", "delete", name)
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	deadline := time.After(d)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if refresh {
				rdmacm.RefreshDevices()
			}
		case <-deadline:
			return errors.New("rdma link delete " + name + " did not finish in " + d.String() +
				" (it ends when this process exits)")
		}
	}
}

// requireRemoved waits up to d until this process holds what it held at
// base, in Go and in the bindings (the kernel's counts of a removed device
// are gone with it).
func requireRemoved(t *testing.T, base snapshot, d time.Duration) {
	t.Helper()
	base.kernel = ""
	requireBaseline(t, base, d)
}
