package cm

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// GlobalStats shows the XRC engines' trouble, which over XRC is neither
// logged nor a connection's error: an uplink rebuilt (a receiving process
// died under a shared INI; the other process's connection moves and
// lives), and a request refused (a Dial to a closed listener whose
// endpoint stays for its accepted connection). Both counts stay once the
// endpoints that made them have closed.
func TestGlobalStatsXRCRecoveriesAndRejected(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	before := GlobalStats()
	srvNode := f.Node("10.1.78.1")
	p1, p2 := srvNode.Process(), srvNode.Process()
	domain := filepath.Join(t.TempDir(), "s") // one XRC domain: the TGT is shared
	l1, err := Listen(ctx, "10.1.78.1:7001", WithFabric(p1), WithDomainPath(domain))
	require.NoError(t, err)
	t.Cleanup(func() { l1.Close() })
	l2, err := Listen(ctx, "10.1.78.1:7002", WithFabric(p2), WithDomainPath(domain))
	require.NoError(t, err)
	t.Cleanup(func() { l2.Close() })
	dopts := []Option{WithFabric(f.Node("10.1.78.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "c"))}
	c1, s1 := dialAccepted(ctx, t, l1, dopts...)
	c2, s2 := dialAccepted(ctx, t, l2, dopts...)
	require.Zero(t, GlobalStats().XRCRecoveries-before.XRCRecoveries)

	p1.Kill()
	c1.Send(ctx, []byte("to a dead process")) // posted: its completion fails the INI
	require.Eventually(t, func() bool { return GlobalStats().XRCRecoveries > before.XRCRecoveries },
		5*time.Second, 5*time.Millisecond, "no recovery counted: %+v", GlobalStats())
	require.NoError(t, c2.Send(ctx, []byte("moved")))
	buf := make([]byte, 16)
	n, err := s2.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "moved", string(buf[:n]))

	require.NoError(t, l2.Close()) // its endpoint stays for s2, refusing requests
	_, err = Dial(ctx, "10.1.78.1:7002", dopts...)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	during := GlobalStats()
	require.Positive(t, during.XRCRejected-before.XRCRejected, "%+v", during)

	for _, c := range []*Conn{c1, s1, c2, s2} {
		c.Close()
	}
	l1.Close()
	after := GlobalStats()
	require.Equal(t, before.XRCQueuePairs, after.XRCQueuePairs, "every endpoint closed: %+v", after)
	require.GreaterOrEqual(t, after.XRCRecoveries, during.XRCRecoveries, "the closed endpoints' recoveries kept")
	require.GreaterOrEqual(t, after.XRCRejected, during.XRCRejected, "the closed endpoints' refusals kept")
}
