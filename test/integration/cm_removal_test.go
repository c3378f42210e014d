//go:build linux && cgo

package integration

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// removalVeth carries the soft-RoCE device that TestCMDeviceRemoval removes:
// a pair of its own, so the other tests' rxe0 stays.
var removalVeth = testVeth("vethrm", 79)

const removalDev = "rxerm0"

// testVeth is the veth pair NAME0 (10.N.0.1/24) and NAME1 (10.N.0.2/24)
// for a test's own soft-RoCE device, so that the other tests' rxe0 stays.
func testVeth(name string, n byte) softroce.VethPair {
	return softroce.VethPair{
		Name: name + "0", Peer: name + "1",
		Addr:     netip.PrefixFrom(netip.AddrFrom4([4]byte{10, n, 0, 1}), 24),
		PeerAddr: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, n, 0, 2}), 24),
	}
}

// removalChildEnv makes TestCMDeviceRemoval run its checks (see there).
const removalChildEnv = "GOXRC_REMOVAL_CHILD"

// TestCMDeviceRemoval removes the RDMA device under a listener, under a
// listener on the unspecified address that holds the device, and under
// connections with calls blocked on both sides, and checks that every call
// fails with ErrDeviceRemoved and that cm lets go of everything on the
// device on its own: the test closes nothing until it has. The checks run
// in a child process (this test binary again): librdmacm keeps a context on
// the device until the process exits, and soft-RoCE's removal waits for
// that (cm/doc.go, "Device removal"), so the removal completes when the
// child exits, which the parent checks.
func TestCMDeviceRemoval(t *testing.T) { removalTest(t, removalChildEnv, removalChild) }

// removalTest runs child in a child process (this test binary, with env
// set) on the removal device, which child removes, and checks that the
// removal completed once the child exited.
func removalTest(t *testing.T, env string, child func(*testing.T)) {
	if os.Getenv(env) != "" {
		child(t)
		return
	}
	softroce.Device(t) // skips off the VM
	_, err := softroce.Setup(removalDev, removalVeth)
	require.NoError(t, err)
	runChild(t, env)
	requireLinkGone(t, removalDev, 30*time.Second)
	require.NoError(t, softroce.DeleteVeth(removalVeth.Name))
}

// runChild runs t again in a child process (this test binary, with env set
// so that t runs its checks there; under the command wrap, if any), logs
// the child's output and fails t unless the child passed.
func runChild(t *testing.T, env string, wrap ...string) {
	t.Helper()
	// The child's leak check may count the device's kernel objects, this
	// process's among them: a device an earlier test left idle here must
	// not close on its timer in the child's window.
	cm.CloseIdleDevices()
	args := slices.Concat(wrap, []string{os.Args[0], "-test.run=^" + t.Name() + "$", "-test.v", "-test.timeout=120s"})
	child := exec.Command(args[0], args[1:]...)
	child.Env = append(os.Environ(), env+"=1")
	out, err := child.CombinedOutput()
	t.Logf("child:\n%s", softroce.ChildOutput(out))
	require.NoError(t, err, "the child's checks failed")
	require.Contains(t, string(out), "--- PASS: "+t.Name())
}

func removalChild(t *testing.T) {
	ip := removalVeth.Addr.Addr()
	// A listener that takes connection requests and never answers, for a
	// Dial that is under way when the device goes.
	silentCh := rdmacmChannel(t)
	silent := rdmacmListen(t, silentCh, rdmacm.PortSpaceTCP, verbs.QPTypeRC, netip.AddrPortFrom(ip, 0))
	ctx := cmCtx(t, 90*time.Second)
	// A listener on the unspecified address, which holds the device from
	// the connection it accepts there (closed before the removal) and must
	// let go of it on its own too.
	wild, err := cm.Listen(ctx, "0.0.0.0:0", cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	// Only this process's objects: the kernel's counts of the device go with it.
	base := baseline(t, "")
	wc, ws := connectAndSend(t, ctx, wild, netip.AddrPortFrom(ip, wild.Addr().(cm.Addr).Port()).String(), "to the wildcard")
	require.NoError(t, wc.Close())
	require.NoError(t, ws.Close())
	require.Equal(t, base.cm.CachedQueuePairs+2, cm.GlobalStats().CachedQueuePairs, "the wildcard listener holds the device: both ends' QPs kept")
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
		conn int // -1: Accept
		what string
		err  error
	}
	results := make(chan result, 2*n+1)
	for i := range n {
		for _, c := range []*cm.Conn{clients[i], servers[i]} {
			go func() {
				_, err := c.Recv(ctx, make([]byte, 256))
				results <- result{i, "Recv on " + c.LocalAddr().String(), err}
			}()
		}
	}
	go func() {
		err := failureOf(l.Accept(ctx))
		results <- result{-1, "Accept", err}
	}()
	dialed := make(chan error, 1)
	go func() {
		c, err := cm.Dial(ctx, netip.AddrPortFrom(ip, silent.LocalAddr().Port()).String(), cm.WithHandshakeTimeout(80*time.Second))
		if c != nil {
			c.Close()
		}
		dialed <- err
	}()
	req, err := silent.WaitEvent(ctx, rdmacm.EventConnectRequest)
	require.NoError(t, err, "the Dial's request")

	// The removal runs in a process of its own, which finishes after this
	// one exits (a thread waiting for that in the kernel could not be
	// interrupted, and would keep this process from exiting).
	require.NoError(t, exec.Command("rdma", "link", "delete", removalDev).Start())

	// Both ends of a connection are on the removed device, and the kernel
	// takes their ids one at a time: an end whose peer went first may see
	// the peer's disconnect before its own removal. The first end of each
	// connection sees the removal.
	removedEnds := make([]int, n)
	for range 2*n + 1 {
		select {
		case r := <-results:
			if r.conn < 0 {
				require.ErrorIs(t, r.err, cm.ErrDeviceRemoved, "%s: %v", r.what, r.err)
				continue
			}
			require.ErrorIs(t, r.err, cm.ErrPeerGone, "%s: %v", r.what, r.err)
			if errors.Is(r.err, cm.ErrDeviceRemoved) {
				removedEnds[r.conn]++
			}
		case <-time.After(60 * time.Second):
			t.Fatal("a blocked call did not return after the device was removed")
		}
	}
	for i, k := range removedEnds {
		require.NotZero(t, k, "connection %d: neither end reported ErrDeviceRemoved", i)
	}
	// The Dial waiting for its answer learns of the removal too, and has
	// let go of its CM id and QP.
	select {
	case err := <-dialed:
		require.ErrorIs(t, err, cm.ErrDeviceRemoved, "the Dial under way")
	case <-time.After(60 * time.Second):
		t.Fatal("a Dial under way did not return after the device was removed")
	}
	require.NoError(t, req.ID.Close())
	// Released before anything was closed: no verbs object, CM id,
	// connection or goroutine is left. The device is closed, not kept
	// idle (which waitObjects, closing idle devices first, would not see).
	require.Eventually(t, func() bool { return cm.GlobalStats().Devices == base.cm.Devices }, 10*time.Second, 20*time.Millisecond,
		"the removed device is still open")
	require.Equal(t, base.cm.DevicesIdle, cm.GlobalStats().DevicesIdle, "the removed device idles")
	waitObjects(t, base, 10*time.Second)

	// Calls after the removal fail the same way; Close still works.
	require.ErrorIs(t, clients[0].Send(ctx, []byte("after")), cm.ErrPeerGone)
	for i := range n {
		require.NoError(t, clients[i].Close())
		require.NoError(t, servers[i].Close())
	}
	require.NoError(t, l.Close())
	err = failureOf(l.Accept(ctx))
	require.ErrorIs(t, err, cm.ErrDeviceRemoved)
	require.NoError(t, wild.Close())
}

// idleRemovalChildEnv makes TestCMIdleDeviceRemoval run its checks.
const idleRemovalChildEnv = "GOXRC_IDLE_REMOVAL_CHILD"

// TestCMIdleDeviceRemoval removes a device that cm keeps open while idle
// (its last connection closed, ten seconds not yet over): the device hears
// of it through the id that anchors it and closes at once, with nothing
// left. The checks run in a child process, as TestCMDeviceRemoval's do.
func TestCMIdleDeviceRemoval(t *testing.T) {
	removalTest(t, idleRemovalChildEnv, idleRemovalChild)
}

func idleRemovalChild(t *testing.T) {
	ip := removalVeth.Addr.Addr()
	base := baseline(t, "") // only this process's objects, as in removalChild
	server, addr := startVictim(t, "acceptor", netip.AddrPortFrom(ip, 0).String())
	ctx := cmCtx(t, 60*time.Second)
	c, err := cm.Dial(ctx, addr, cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	require.NoError(t, c.Send(ctx, []byte("idle")))
	buf := make([]byte, 256)
	k, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "idle", string(buf[:k]))
	require.NoError(t, c.Close())
	s := cm.GlobalStats()
	require.Equal(t, base.cm.Devices+1, s.Devices)
	require.Equal(t, base.cm.DevicesIdle+1, s.DevicesIdle, "the device idles")

	// The server process exits when its listener hears of the removal.
	require.NoError(t, exec.Command("rdma", "link", "delete", removalDev).Start())
	// Well within the idle time, which would close the device too.
	require.Eventually(t, func() bool { return cm.GlobalStats().Devices == base.cm.Devices }, 5*time.Second, 20*time.Millisecond,
		"the idle device did not close on its removal")
	require.Equal(t, base.cm.DevicesIdle, cm.GlobalStats().DevicesIdle)
	server.Wait()
	require.Equal(t, 3, server.ProcessState.ExitCode(), "the server's listener did not fail on the removal")
	waitObjects(t, base, 10*time.Second)
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

// requireLinkGone waits up to d until the RDMA link name is gone.
func requireLinkGone(t *testing.T, name string, d time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		ls, err := softroce.Links()
		return err == nil && !slices.ContainsFunc(ls, func(l softroce.Link) bool { return l.Name == name })
	}, d, 100*time.Millisecond, "rdma link delete %s did not finish after the process on it exited", name)
}
