package cm

import (
	"context"
	"net/netip"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/xrc/memfabric"
	"github.com/stretchr/testify/require"
)

// holdDestroyID holds the first DestroyID after arm until release.
type holdDestroyID struct {
	kernel.Kernel
	mu      sync.Mutex
	armed   bool
	at      chan struct{}
	release chan struct{}
}

func (k *holdDestroyID) DestroyID(id kernel.ID) error {
	k.mu.Lock()
	held := k.armed
	k.armed = false
	k.mu.Unlock()
	if held {
		close(k.at)
		<-k.release
	}
	return k.Kernel.DestroyID(id)
}

// GlobalStats counts an XRC endpoint's QPs until its Close has destroyed
// them, as xrc.Stats does (the process holds them meanwhile). cm took the
// endpoint out of the sum before its Close began: for the Close (FINs for
// up to a second, then the release), XRCUplinks, XRCDownlinks and
// XRCQueuePairs left out an INI and TGT handles the kernel still held, and
// on a process shared with another endpoint XRCKernelHandles still counted
// them. Here the dialer's kernel holds the first CM id destroy from its
// last connection's Close on (its listener's, in the endpoint's Close),
// its reverse leg's TGT handle still held: the server takes nothing.
func TestGlobalStatsXRCCountsEndpointUntilClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	checkGoroutines(t)
	base := GlobalStats()
	f := model.NewFabric(model.ReuseLIFO)
	srvNode := f.AddNode(netip.MustParseAddr("10.1.77.1"), model.NodeConfig{})
	cliNode := f.AddNode(netip.MustParseAddr("10.1.77.2"), model.NodeConfig{})
	sp, cp := srvNode.NewProcess(), cliNode.NewProcess()
	t.Cleanup(func() { sp.Close(); cp.Close() })
	hk := &holdDestroyID{Kernel: cp, at: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(hk.release) }) }
	defer release()
	srv := kernel.Carry(sp).(*memfabric.Process)
	cli := kernel.Carry(hk).(*memfabric.Process)
	l, err := Listen(ctx, "10.1.77.1:7000", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "s")))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	c, s := dialAccepted(ctx, t, l, WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "c")))
	_ = s // open: the dialer's reverse leg keeps its TGT handle
	qps := func() int {
		ini, tgt := srvNode.QPCount()
		ini2, tgt2 := cliNode.QPCount()
		return ini + tgt + ini2 + tgt2
	}
	require.Equal(t, 4, qps(), "an INI and a TGT on each node")
	// The server takes nothing from now on: it never reads the dialer's
	// FIN, so it sends none, and the dialer's reverse leg keeps its TGT
	// handle through the Close.
	sp.PauseReceives()
	defer sp.ResumeReceives()
	hk.mu.Lock()
	hk.armed = true
	hk.mu.Unlock()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }() // the dialer endpoint's last connection: it closes
	select {
	case <-hk.at:
	case <-ctx.Done():
		t.Fatal("the dialer endpoint's Close destroyed no CM id")
	}
	// Read before the kernel: nothing is made meanwhile, so the kernel
	// can only have let go of more by then (the dialer's INI may go, its
	// uplink torn down after the FIN).
	g := GlobalStats()
	n, handles := qps(), srvNode.TGTHandleTotal()+cliNode.TGTHandleTotal()
	require.Equal(t, 1, cliNode.TGTHandleTotal(), "the closing endpoint's TGT handle, not destroyed yet")
	require.GreaterOrEqual(t, g.XRCDownlinks-base.XRCDownlinks, handles,
		"TGT handles counted while the dialer endpoint's Close holds one: %+v (the kernel holds %d)", g, handles)
	require.GreaterOrEqual(t, g.XRCQueuePairs-base.XRCQueuePairs, n,
		"XRC QPs counted while the dialer endpoint's Close holds them: %+v (the kernel holds %d)", g, n)
	release()
	require.NoError(t, <-closed)
}
