//go:build linux && cgo

package integration

import (
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// regionVeth carries TestCMRemovedDeviceKeptForRegion's two devices: the one
// removed on its first end, one added on its second.
var regionVeth = testVeth("vethan", 83)

const (
	regionDev      = "rxean0"
	regionOtherDev = "rxean1"
	regionChildEnv = "GOXRC_REGION_REMOVAL_CHILD"
)

// TestCMRemovedDeviceKeptForRegion removes a device while a Region
// registered on it is the only thing left there, after every connection and
// listener on it closed. librdmacm closes a removed device's context once
// no CM id is left on it and a later call shows it the device is gone (an
// id that reaches a device it does not know yet, here one added after the
// removal); the Region's memory and the PD under it must be gone before
// that, or their Close uses a freed context. soft-RoCE's removal waits for
// the context to close, so `rdma link delete` still running shows it open:
// it must run until the Region is closed, and end after that while the
// process goes on. Checks in a child process, as in TestCMDeviceRemoval.
func TestCMRemovedDeviceKeptForRegion(t *testing.T) {
	if os.Getenv(regionChildEnv) != "" {
		regionRemovalChild(t)
		return
	}
	softroce.Device(t) // skips off the VM
	_, err := softroce.Setup(regionDev, regionVeth)
	require.NoError(t, err)
	runChild(t, regionChildEnv)
	require.NoError(t, softroce.DeleteLink(regionOtherDev))
	requireLinkGone(t, regionOtherDev, 30*time.Second)
	require.NoError(t, softroce.DeleteVeth(regionVeth.Name))
}

func regionRemovalChild(t *testing.T) {
	ctx := cmCtx(t, 90*time.Second)
	l, err := cm.Listen(ctx, netip.AddrPortFrom(regionVeth.Addr.Addr(), 0).String(), cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	c, s := connectAndSend(t, ctx, l, l.Addr().String(), "before")
	region, err := c.RegisterMemory(4096, 0)
	require.NoError(t, err)
	copy(region.Bytes(), "kept")
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, l.Close())

	// Removal of the device, which holds nothing of this process's but
	// the Region (and what the Region needs).
	del := exec.Command("rdma", "link", "delete", regionDev)
	require.NoError(t, del.Start())
	deleted := make(chan error, 1)
	go func() { deleted <- del.Wait() }()
	// A device librdmacm does not know yet, reached by an id: it reads the
	// device list again and finds the removed one gone.
	require.NoError(t, softroce.AddLink(regionOtherDev, regionVeth.Peer))
	require.Eventually(t, func() bool { return softroce.HasGID(regionOtherDev, regionVeth.PeerAddr.Addr()) },
		10*time.Second, 50*time.Millisecond, "%s has no GID for %v", regionOtherDev, regionVeth.PeerAddr.Addr())
	ch := rdmacmChannel(t)
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	require.NoError(t, err)
	require.NoError(t, id.Bind(netip.AddrPortFrom(regionVeth.PeerAddr.Addr(), 0)))
	require.Equal(t, regionOtherDev, id.DeviceName())
	require.NoError(t, id.Close())

	select {
	case err := <-deleted:
		t.Fatalf("rdma link delete %s ended (%v) while a Region was registered on it: the device's context was closed under it", regionDev, err)
	case <-time.After(3 * time.Second):
	}
	require.Equal(t, "kept", string(region.Bytes()[:4]))
	require.NoError(t, region.Close())
	select {
	case err := <-deleted:
		require.NoError(t, err, "rdma link delete %s", regionDev)
	case <-time.After(30 * time.Second):
		t.Fatalf("rdma link delete %s still waits 30 s after the last Region on it closed: the device's context is still open", regionDev)
	}
}
