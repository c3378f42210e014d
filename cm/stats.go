package cm

import "sync/atomic"

// Stats are counters of one connection.
type Stats struct {
	// MessagesSent and MessagesReceived count the application's messages
	// (Send and Recv, or NetConn's chunks), BytesSent and BytesReceived
	// their payload bytes.
	MessagesSent     uint64
	MessagesReceived uint64
	BytesSent        uint64
	BytesReceived    uint64
	// CreditFrames counts flow-control messages sent without data.
	CreditFrames uint64
	// Keepalives counts idle probes (WithKeepalive).
	Keepalives uint64
	// Errors is 1 once the connection broke for a reason other than Close
	// or the peer's end of stream (a raw peer's disconnect): the peer
	// vanished or disconnected without its FIN, a request failed, the peer
	// broke the protocol. A peer's death counts once the transport has
	// heard of it, whether or not the application calls (RC: the CM's
	// word of the disconnect; XRC: the engine's verdict). On RC such a
	// failure is logged once, at Warn (over XRC it is not logged: see
	// WithLogger).
	Errors uint64
}

// Stats returns the connection's counters.
func (c *Conn) Stats() Stats {
	if !c.ok() {
		return Stats{}
	}
	c.mu.Lock()
	msgsRecv, bytesRecv := c.stats.msgsRecv, c.stats.bytesRecv
	c.mu.Unlock()
	s := Stats{
		MessagesSent:     c.stats.msgsSent.Load(),
		MessagesReceived: msgsRecv,
		BytesSent:        c.stats.bytesSent.Load(),
		BytesReceived:    bytesRecv,
		CreditFrames:     c.stats.creditFrames.Load(),
		Keepalives:       c.stats.keepalives.Load(),
		Errors:           c.stats.errors.Load(),
	}
	if c.x != nil {
		// Over XRC the engine sends the connection's credit frames, and
		// has the last word on how it ended: a Send may fail at a
		// receiver gone after its FIN, an orderly end.
		s.CreditFrames = c.x.CreditFrames()
		if xrcFailed(c.x.Err()) {
			s.Errors = 1
		}
	}
	return s
}

// ProcessStats are counters of every connection in this process. GlobalStats
// reads each on its own, not as one snapshot: a queue pair going into the
// cache, say, may be in neither count for a moment.
type ProcessStats struct {
	// ConnectionsOpen is the number of Conns not yet released (an RC one on
	// a removed device closes itself; one closed through its net.Conn
	// adapter counts until its background release, after the CM's
	// time-wait); ConnectionsTotal counts every connection ever
	// established.
	ConnectionsOpen  int64
	ConnectionsTotal uint64
	// QueuePairs is the number of RC queue pairs of open connections and
	// handshakes under way; cached ones are CachedQueuePairs.
	QueuePairs int64
	// CachedQueuePairs is the number of closed connections' queue pairs
	// (with their CQs) kept, reset, for new connections of the same
	// sizes; QueuePairsReused counts connections that took one.
	CachedQueuePairs int64
	QueuePairsReused uint64
	// Listeners is the number of open listeners.
	Listeners int64
	// Devices is the number of RDMA devices cm holds open; DevicesIdle of
	// them are used by nothing and close after ten seconds (see
	// CloseIdleDevices).
	Devices     int64
	DevicesIdle int64
	// BufferBytes is the connections' buffer memory registered with
	// devices: in use, and free in the devices' pools for new connections
	// (BufferBytesKept of it in registrations of over 1 MiB, which go
	// after ten seconds unused). BufferRegistrations counts the
	// registrations made; a connection whose buffers the pool had makes
	// none.
	BufferBytes         int64
	BufferBytesKept     int64
	BufferRegistrations uint64
	// DialErrors and AcceptErrors count failed connection attempts, not
	// the requests an XRC listener's engine refuses (XRCRejected).
	DialErrors   uint64
	AcceptErrors uint64
	// PortErrors counts the times a port of a device in use went down
	// (PORT_ERR; see "Device events" in the package doc).
	PortErrors uint64
	// XRC connections (WithFabric, or an XRC mode on a device with XRC):
	// INI QPs (one per remote node and domain, retired ones not yet
	// destroyed, and those of links being set up), TGT
	// handles (one per remote sender), receiving legs counted over them,
	// XRC QPs held, and every kernel handle and CM id the engine holds.
	XRCUplinks       int
	XRCDownlinks     int
	XRCLocalCounts   int
	XRCQueuePairs    int
	XRCKernelHandles int
	// XRCRecoveries counts the rebuilds of an XRC uplink begun (its INI
	// failed: a send error such as one to a remote process that died, a
	// TGT gone, the peer node's disconnect, a send queue that stayed
	// full); the uplink's connections stall while they move, and a peer
	// that lies about its TGTs drives them. XRCRejected counts the
	// connection requests the XRC engines refused, for any reason (a
	// malformed or hostile request, a stale move, a closed listener's
	// port, a TGT the kernel would not make). Both are xrc.Stats' counts,
	// summed over the process's endpoints, closed ones included.
	XRCRecoveries uint64
	XRCRejected   uint64
}

var globalStats struct {
	connsOpen       atomic.Int64
	connsTotal      atomic.Uint64
	qps             atomic.Int64
	cachedQPs       atomic.Int64
	qpsReused       atomic.Uint64
	listeners       atomic.Int64
	devices         atomic.Int64
	devicesIdle     atomic.Int64
	bufferBytes     atomic.Int64
	bufferBytesKept atomic.Int64
	bufferRegs      atomic.Uint64
	dialErrors      atomic.Uint64
	acceptErrors    atomic.Uint64
	portErrors      atomic.Uint64
}

// GlobalStats returns the process-wide counters.
func GlobalStats() ProcessStats {
	xs := xrcStats()
	return ProcessStats{
		XRCUplinks:          xs.Uplinks,
		XRCDownlinks:        xs.Downlinks,
		XRCLocalCounts:      xs.LocalCounts,
		XRCQueuePairs:       xs.QPs,
		XRCKernelHandles:    xs.KernelHandles,
		XRCRecoveries:       xs.Recoveries,
		XRCRejected:         xs.Rejected,
		ConnectionsOpen:     globalStats.connsOpen.Load(),
		ConnectionsTotal:    globalStats.connsTotal.Load(),
		QueuePairs:          globalStats.qps.Load(),
		CachedQueuePairs:    globalStats.cachedQPs.Load(),
		QueuePairsReused:    globalStats.qpsReused.Load(),
		Listeners:           globalStats.listeners.Load(),
		Devices:             globalStats.devices.Load(),
		DevicesIdle:         globalStats.devicesIdle.Load(),
		BufferBytes:         globalStats.bufferBytes.Load(),
		BufferBytesKept:     globalStats.bufferBytesKept.Load(),
		BufferRegistrations: globalStats.bufferRegs.Load(),
		DialErrors:          globalStats.dialErrors.Load(),
		PortErrors:          globalStats.portErrors.Load(),
		AcceptErrors:        globalStats.acceptErrors.Load(),
	}
}
