//go:build linux && cgo

package integration

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/kernel/real"
	"github.com/goxrc/goxrc/test/softroce"
)

// eventsVeth carries the soft-RoCE device whose port TestCMPortEvents takes
// down and up: a pair of its own, so the other tests' rxe0 stays up.
var eventsVeth = testVeth("vethpe", 81)

const eventsDev = "rxepe0"

// eventsNetdev sets up eventsDev on its veth pair (skipping off the VM) and
// returns the netdev under it, which is brought up again when the test ends.
func eventsNetdev(t *testing.T) netlink.Link {
	softroce.Device(t) // skips off the VM
	_, err := softroce.Setup(eventsDev, eventsVeth)
	require.NoError(t, err)
	netdev, err := netlink.LinkByName(eventsVeth.Name)
	require.NoError(t, err)
	t.Cleanup(func() { netlink.LinkSetUp(netdev) })
	return netdev
}

// TestCMPortEvents takes the netdev under a soft-RoCE device down and up
// again under a live connection: rxe reports PORT_ERR and PORT_ACTIVE, which
// cm reads from the device's async fd. Each end logs both, the process
// counts the PORT_ERR, and the connection, idle while the port was down,
// carries on once it is back.
func TestCMPortEvents(t *testing.T) {
	netdev := eventsNetdev(t)
	logs := &logRecorder{}
	log := slog.New(logs)
	ctx := cmCtx(t, 60*time.Second)
	opts := []cm.Option{cm.WithMessageSize(256), cm.WithQueueDepth(4), cm.WithLogger(log)}
	l, err := cm.Listen(ctx, netip.AddrPortFrom(eventsVeth.Addr.Addr(), 0).String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	client, server := dialAccept(t, ctx, l, opts...)
	exchange(t, ctx, client, server, "before")

	before := cm.GlobalStats().PortErrors
	require.NoError(t, netlink.LinkSetDown(netdev))
	require.Eventually(t, func() bool {
		return logs.count(slog.LevelWarn, "RDMA port down") >= 2
	}, 20*time.Second, 20*time.Millisecond, "both ends log the port going down; log:\n%s", logs)
	require.NoError(t, netlink.LinkSetUp(netdev))
	require.Eventually(t, func() bool {
		return logs.count(slog.LevelInfo, "RDMA port active") >= 2
	}, 20*time.Second, 20*time.Millisecond, "both ends log the port coming back; log:\n%s", logs)

	// The port event broke nothing: the connection works both ways.
	exchange(t, ctx, client, server, "after")
	exchange(t, ctx, server, client, "and back")
	require.Zero(t, logs.count(slog.LevelWarn, "connection failed"), "log:\n%s", logs)
	// rxe reports the netdev coming up twice (NETDEV_UP, NETDEV_CHANGE);
	// each change is logged once per connection end and counted once for
	// the process.
	require.Equal(t, 2, logs.count(slog.LevelWarn, "RDMA port down"), "log:\n%s", logs)
	require.Equal(t, 2, logs.count(slog.LevelInfo, "RDMA port active"), "log:\n%s", logs)
	require.Equal(t, before+1, cm.GlobalStats().PortErrors, "one PORT_ERR, counted once for the process")
	t.Logf("log:\n%s", logs)
	require.NoError(t, client.Close())
	require.NoError(t, server.Close())
}

// TestXRCRealSeamReadsAsyncEvents: the XRC engine's kernel on a real device
// (internal/kernel/real) reads its device context's async events, which the
// kernel would otherwise keep queued for as long as the process runs. rxe
// reports PORT_ERR and PORT_ACTIVE when its netdev goes down and up; the
// seam opens on a device without XRC too, so this runs on soft-RoCE.
func TestXRCRealSeamReadsAsyncEvents(t *testing.T) {
	netdev := eventsNetdev(t)
	base := baseline(t, eventsDev)
	p, err := real.Open(eventsDev, eventsVeth.Addr.Addr(), real.Options{})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() }) // closed below; this on a failure
	require.Zero(t, p.AsyncEventsRead())
	require.NoError(t, netlink.LinkSetDown(netdev))
	require.Eventually(t, func() bool { return p.AsyncEventsRead() >= 1 }, 20*time.Second, 20*time.Millisecond, "PORT_ERR read")
	require.NoError(t, netlink.LinkSetUp(netdev))
	require.Eventually(t, func() bool { return p.AsyncEventsRead() >= 2 }, 20*time.Second, 20*time.Millisecond, "PORT_ACTIVE read")
	t.Logf("%d async events read", p.AsyncEventsRead())
	require.NoError(t, p.Close())
	waitObjects(t, base, 10*time.Second)
}

// dialAccept dials l and returns both ends.
func dialAccept(t *testing.T, ctx context.Context, l *cm.Listener, opts ...cm.Option) (dialed, accepted *cm.Conn) {
	t.Helper()
	c, err := cm.Dial(ctx, l.Addr().String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() }) // the caller closes both; this on a failure
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { s.Close() })
	return c, s
}

// exchange sends msg from one end and checks that the other receives it.
func exchange(t *testing.T, ctx context.Context, from, to *cm.Conn, msg string) {
	t.Helper()
	require.NoError(t, from.Send(ctx, []byte(msg)))
	buf := make([]byte, 256)
	k, err := to.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, msg, string(buf[:k]))
}

// logRecorder is a slog.Handler that keeps every record's level and message.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }

func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec.Clone())
	r.mu.Unlock()
	return nil
}

// count is the number of records at level whose message starts with msg.
func (r *logRecorder) count(level slog.Level, msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if rec.Level == level && strings.HasPrefix(rec.Message, msg) {
			n++
		}
	}
	return n
}

func (r *logRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, rec := range r.recs {
		b.WriteString(rec.Level.String() + " " + rec.Message)
		rec.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		b.WriteByte('\n')
	}
	return b.String()
}
