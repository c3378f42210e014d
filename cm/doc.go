// Package cm connects Go programs over RDMA by IP address.
//
// A server listens on an ip:port and a client dials it, as with package net.
// Underneath, the RDMA connection manager resolves the address to a device
// and a route, and each connection gets its own reliable-connected (RC)
// queue pair. Applications never see queue pair numbers, GIDs or routes.
//
//	l, err := cm.Listen(ctx, "10.0.0.1:7471")
//	...
//	conn, err := l.Accept(ctx)
//
//	conn, err := cm.Dial(ctx, "10.0.0.1:7471")
//	err = conn.Send(ctx, []byte("hello"))
//	n, err := conn.Recv(ctx, buf)
//
// Addresses are IPv4 or IPv6, or host names, looked up with
// net.DefaultResolver or the resolver of WithResolver: Dial tries each of a
// name's addresses in turn, as net.Dial does, and Listen takes the first.
// An IPv6 link-local address
// (every RoCE port has one, its first GID) takes the zone naming its
// interface, as in package net: "[fe80::1%eth0]:7471"; binding one without
// it fails with a clear error; a zone given as an interface index is kept
// as the interface's name, the form the CM reports. A connection's LocalAddr
// and RemoteAddr carry the zone too, so either can be dialed back; on a
// listener on the unspecified address it comes from the device's GID table
// (the kernel does not say which interface a connection came in on). An
// accepted connection's LocalAddr is the address the dialer reached, also
// when the listener is on the unspecified address. A port may be a service name
// ("http"). An empty host (":7471") is IPv4's unspecified address, not a
// dual-stack one as in net.Listen: use "[::]:7471" for IPv6. A dial leaves
// from the address the route picks, or from the one WithLocalAddr names, as
// with net.Dialer's LocalAddr.
//
// # Messages and flow control
//
// A Conn carries messages up to a maximum size (WithMessageSize) with a
// fixed number of receive buffers (WithQueueDepth), all registered once,
// outside the Go heap. Every message carries a 32-bit header in its
// immediate data (so the payload needs no extra packet) that returns
// credits: a sender posts only as many messages as the peer has free receive
// buffers, so a fast sender waits instead of provoking receiver-not-ready
// retries or losing messages. Credits ride on the next message; a credit
// frame of their own goes when half the buffers wait or the peer is short.
// Credit frames use the peer's buffers too, and theirs come back with the
// next message or, when none follows, after a delay (a persist timer, as
// in TCP, which also returns what was read while a short peer waits), so
// credit frames never answer each other. A connection makes
// progress inside its callers' calls (Send, Recv, the one-sided calls,
// Close); when its application stops calling with messages of its own out,
// or holding buffers of the peer's, a reaper (a timer, 10 ms at first,
// backing off to a second, and to a tenth of a second again once the
// application calls) takes the credit frames the peer sent, so that a
// peer that has only received can still send its queue depth, and the frame
// in which a sender says it is short, so that what a reader read before it
// stopped calling goes back and its sender can fill the depth. A FIN that
// takes a side's last credit carries every buffer it consumed, so two sides
// never both sit at no credit. Send and Recv do not allocate.
//
// # Resources per device
//
// Connections on one device share its context, protection domain and one
// completion channel (read by one goroutine in the netpoller), and take
// their buffers from a pool of large registrations; all of it lives while a
// connection, a listener or a Region on the device does, and ten seconds
// more (ProcessStats.DevicesIdle), so that a process that only dials does
// not open the device and register its buffers again for each connection
// (unless cm cannot watch it for removal: an address that librdmacm binds
// to another device first, one address on two devices); CloseIdleDevices
// closes idle devices at once. Buffers over 1 MiB (the
// default sizes take 9 MiB a side) are registrations of their own;
// a closed connection's are kept for the next connection of its sizes for
// ten seconds, up to 128 MiB a device (ProcessStats.BufferBytesKept). The
// lock limit (RLIMIT_MEMLOCK) is the process's: where the kernel refuses a
// registration for want of lockable memory, every device's kept buffers
// and every other idle device go first, and it is tried once more.
//
// While a listener holds the device, a closed connection's queue pair and
// completion queue are reset and kept, once the CM has left time-wait and
// after a cool-off of eight seconds, for the next connection of the same
// sizes (ProcessStats.CachedQueuePairs, at most 512 per device). A listener on an
// unspecified address (":port", "[::]:port") serves whichever device the
// requests come in on: it holds each device from the first connection it
// accepts there until it closes, through a CM id it binds to the device (an
// ephemeral port, as a Dial takes; where it cannot bind one it holds
// nothing, and logs why at Debug). When a device it holds is removed, that
// id hears of it, and the listener lets the device go at once and goes on
// listening on the others.
//
// # One-sided RDMA
//
// RegisterMemory exposes memory to the peer, with the Access it grants
// (RemoteRead, RemoteWrite, or nothing for memory that is only the local
// side of this side's operations); hand it the Descriptor in a message, and
// the peer's WriteRemote and ReadRemote move data without this side's CPU.
// Closing the Region revokes the access; a peer's access to a revoked
// region, as to one that does not grant it, breaks the connection on both
// sides.
//
// # Streams
//
// NetConn adapts a Conn to net.Conn with stream semantics and deadlines, and
// Listener.NetListener to net.Listener, so net/http and other net.Conn users
// run over RDMA unchanged. Conn.CloseWrite (also on the adapter, as on
// *net.TCPConn) half-closes: the peer reads io.EOF after the data sent so far
// while its own messages keep coming, which proxies that copy each direction
// until EOF need.
//
// # Interoperability
//
// Framed connections (the default) speak goxrc's handshake and header and
// talk only to goxrc peers. WithRawMessages drops both: each Send is one
// plain RDMA send and each receive buffer one message, which is what
// rdma-core's rdma_server and rdma_client examples and other plain
// librdmacm programs do. Raw connections have no flow control. A raw
// peer's RDMA write with immediate data (a common write-then-notify) arrives
// as a message of no bytes carrying the immediate (RecvWithImm): its data
// is in the region the peer wrote. A framed connection fails with
// ErrProtocol if its peer writes so.
//
// # Errors and waiting
//
// Every operation that waits waits in Go's netpoller, never in a blocking C
// call, and takes a context.Context, except the Close family: Conn.Close
// and CloseWrite, Listener.Close and Region.Close take none and are bounded
// instead by the handshake timeout (WithHandshakeTimeout) and the CM's
// time-wait (Conn.Close; about 2 s on soft-RoCE). Errors are *OpError values
// (net.Error; NetConn's are *net.OpError values around them), except that
// a call on a nil Conn or Listener, which has no address to name,
// returns ErrClosed itself, as a nil *os.File's return os.ErrInvalid; a
// lost peer is ErrPeerGone, a protocol violation ErrProtocol,
// an option or argument the call cannot take ErrInvalid (an address that
// does not parse, as in package net, a *net.AddrError),
// a rejected connection matches syscall.ECONNREFUSED, as a refused TCP
// dial does, and wraps *rdmacm.RejectError (over XRC, *xrc.RejectError,
// whose Reason says why: NO_LISTENER where nothing listens); a request
// nobody answered wraps the same types but matches its errno instead
// (ETIMEDOUT, a Timeout, from the CM), so test for a refusal with
// ECONNREFUSED; a deadline
// that passed matches both context.DeadlineExceeded and
// os.ErrDeadlineExceeded. Close is graceful: it wakes the connection's
// blocked Sends and Recvs (they return ErrClosed), and the peer reads the
// data sent before it, then io.EOF (raw connections have no end of stream:
// their peer sees ErrPeerGone at the disconnect). Close waits for that no
// longer than the handshake timeout: over XRC, a peer that takes nothing in
// meanwhile (a stopped process) loses what it had not taken, and learns so
// (ErrPeerGone) where the closer does not (Close returns nil, as a TCP
// close does); on RC the device has already received it. MaxMessageSize is what Send takes; size Recv
// buffers with MaxRecvSize, which always fits (over XRC the two sides'
// limits need not agree).
//
// # Device removal
//
// When the RDMA device goes away (rdma link delete, a driver unloaded, a
// device unplugged), the RDMA CM tells every id on it. Every connection and
// listener on the device then fails with ErrDeviceRemoved (a listener on
// the unspecified address is on no one device: it lets go of the removed
// one and goes on accepting on the others; a connection's
// error wraps ErrPeerGone too; one whose peer was on the same device may
// report the peer's disconnect, which came first), and releases everything
// it holds on the device at once, without waiting for the application's
// Close; Close then returns nil. Messages the connection had taken in
// before are still read (copied out of the buffers given back), then a
// Recv after the peer's end of stream still returns io.EOF, as a TCP
// socket that had the FIN does: nothing was lost. A device kept open while idle
// closes at once. A device that can take contexts away from a
// process (mlx5) is then gone. One that cannot (soft-RoCE) waits until every
// process has closed its context, and librdmacm keeps a context on every
// device it has used until the process exits: it drops a removed one only
// when it reads the device list again (rdma_get_devices), and doing that
// while a removal waits (rdma-core 44 on soft-RoCE, seen in the VM) can
// leave it without the devices that stay, and its next call hung. So cm does
// not make it read the list, and on such a device the removal completes
// when the process exits.
//
// # Device events
//
// cm reads each device's asynchronous events (what ibv_asyncwatch prints)
// for as long as it uses the device, waiting in the netpoller. A QP or CQ
// error the device reports (QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR, CQ_ERR)
// fails the connection it names with ErrPeerGone and the device's reason.
// DEVICE_FATAL (a device failing, or taken away from the process by a driver
// that can) is handled as a removal: every connection on the device fails
// with ErrDeviceRemoved and lets go of the device. A Dial whose connection
// is established as the device fails returns ErrDeviceRemoved rather than
// the failed connection, as over XRC, and a listener drops such a
// connection rather than hand it to Accept. A port going down
// (PORT_ERR) breaks nothing by itself: each connection on the port logs a
// warning, ProcessStats.PortErrors counts it, and a connection fails only
// when its transport gives up retrying, or its keepalive (WithKeepalive)
// does; one that sees the port come back first (PORT_ACTIVE, logged at
// Info) carries on, as a TCP connection does over a link that flaps. The
// events come from librdmacm's context on the device, which every user of
// librdmacm in the process shares: a program that reads that context's
// events itself while cm uses the device gets only some of them.
//
// # Transports
//
// By default connections run over RC. WithXRC(XRCPrefer) or
// WithXRC(XRCRequire) asks for XRC, which shares receive queue pairs among
// the processes of a node: once the address (and, for Dial, the route) is
// resolved, the device is probed (its capability bit, then a private XRC
// domain, once per device and process). On a device with XRC, connections
// run on package xrc's engine: Listen opens an XRC endpoint of its own on
// that device (or takes over a closed listener's, below), and the Dials of the process to that device and local
// address with the same message size, queue depth, domain path and
// handshake timeout share one dialer endpoint (one INI QP per remote node),
// closed with the last of its connections; a Dial whose options differ gets
// an endpoint of its own. Each endpoint is a sender of its own: a
// listener's answers its accepted connections over an INI of its own, so a
// process that dials a remote node and accepts from it too holds two INIs
// there and is two senders to its TGTs. N nodes of P processes, each dialing
// every process of the other nodes, hold 4*P*(N-1) XRC QPs a node (RC:
// 2*P*P*(N-1)), twice package xrc's count for one endpoint per process that
// both dials and accepts. Closing an XRC listener refuses new connections
// at once and leaves the accepted ones open, as on RC, but its port stays
// bound until the last of them closes: their peers move and recover legs
// through it. A Listen on that address with the same message size, queue
// depth, domain path and handshake timeout meanwhile takes the closed
// listener's endpoint over and accepts again (a server listening anew after
// http.Server.Shutdown); with other options it fails with EADDRINUSE until
// the port is free. An XRC dialer reaches only XRC listeners: an RC
// listener (RDMA_PS_TCP) never sees the XRC requests (RDMA_PS_IB and
// RDMA_PS_UDP), and the peer's CM refuses them as meeting no listener (REJ
// reason 8, or SIDR status 1). An XRCPrefer Dial that is refused so logs
// why and dials again over RC, so in a mixed cluster a node whose device
// has XRC reaches RC-only listeners (and XRC-less peers, whose XRCPrefer
// listeners are RC). The refusal is remembered for 30 seconds: the
// process's XRCPrefer Dials from that device and local address to that
// ip:port go over RC meanwhile without asking, unless one of them fails,
// which makes the next one ask again. Only that refusal
// does: a Dial whose XRC request goes unanswered, or that an XRC listener
// refuses, fails, and XRCRequire fails on that refusal too (ECONNREFUSED,
// *xrc.RejectError with Reason NO_LISTENER). The other way round, an
// XRCPrefer listener on a device with XRC also listens for RC on its port
// (an RC CM id beside the XRC endpoint), so XRCOff dialers and dialers on
// devices without XRC reach it and Accept returns their RC connections
// among the XRC ones; closing it frees the RC port at once. An XRCRequire
// listener is reached by XRC dialers only. On a device without XRC (soft-RoCE has none),
// XRCPrefer logs why and uses RC (Conn.Transport says which a connection
// got), and XRCRequire fails with ErrNotSupported
// and the reason, as do raw messages (RC only). The probe does not try
// ibv_open_qp: it would destroy an opened TGT handle, which mlx5 mishandles
// (docs/xrc-protocol.md). A listener on an unspecified address without
// WithDevice serves every device and so is never XRC. No device
// here has XRC: the XRC path is tested on the in-memory fabric and, on a
// device, only where one with XRC is present.
//
// The addresses of an XRC connection are its endpoints' listening
// addresses: every connection between two endpoints (a process's Dials
// with the same options share one) has the same LocalAddr and RemoteAddr, which
// do not tell its connections apart as a TCP 4-tuple does.
//
// WithFabric runs connections over XRC on an in-memory fabric (package
// xrc/memfabric) with the same engine: the same API, for tests without RDMA
// hardware. XRC connections carry framed messages; raw messages, immediate
// data and one-sided RDMA give ErrNotSupported. Their flow control is the
// engine's: WithQueueDepth is how many messages a connection holds
// received and not yet taken by Recv before its sender waits (the receive
// buffers themselves belong to the process's shared receive queue), and
// WithMessageSize sizes that queue's buffers (64 bytes to 1 MiB over XRC)
// and is what the endpoint's peers may send it. An XRC Send, like an RC
// one, returns once its message is posted; the engine
// keeps the message until its completion, to send it again if the uplink
// is rebuilt meanwhile.
package cm
