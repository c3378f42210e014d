// Package xrc is the XRC engine: how processes on a node share one XRC
// domain so that a process sends to every process of a remote node over one
// INI QP, and a node keeps one TGT QP per remote sending process, shared by
// every local receiver through the kernel's handle count. For N nodes of P
// processes connected all to all, a node holds 2*P*(N-1) QPs where RC needs
// P*P*(N-1). The protocol is in docs/xrc-protocol.md.
//
// Applications see addresses (ip:port) and messages only:
//
//	ep, err := xrc.NewEndpoint(ctx, xrc.Config{Addr: "10.0.0.1:7000"}) // the device of 10.0.0.1
//	// or xrc.Config{Process: p, Addr: ...} on an in-memory fabric (memfabric)
//	c, err := ep.Dial(ctx, "10.0.0.2:7000") // or ep.Accept(ctx)
//	err = c.Send(ctx, msg)
//	n, err := c.Recv(ctx, buf)
//	c.Close()
//	ep.Close()
//
// A nil or zero Conn or Endpoint (a Dial, Accept or NewEndpoint whose error
// went unchecked) is a closed one, as in package cm: a call on it returns
// ErrClosed itself, not an *OpError (there is no address to name), Close
// returns nil, and the accessors give their zero values (Endpoint.Err gives
// ErrClosed, as after Close).
//
// An Endpoint is one process's engine. It opens the node's shared domain
// (the domain file in Config.DomainDir), creates its XRC SRQ, and listens on
// one port number for both exchanges of the protocol: the physical link (an
// XRC-typed connected CM exchange that makes an INI/TGT pair) and the
// virtual link (a SIDR exchange that adds a connection to an existing pair).
// Uplinks (INIs) are kept per remote node and domain, in states NONE,
// CONNECTING (dials queue), UP and RECOVERING; downlinks (TGT handles) are
// kept by the acceptor, at most one kernel handle per TGT per process with a
// local use count over it.
//
// A Conn is bidirectional: the dialer's leg and the acceptor's reverse
// leg, each one way; Dial returns once both are up, and Accept once the
// dialer's first frame on its leg says it has taken the connection (a
// dial given up before sends its FIN first, and Accept never sees it). When the
// acceptor already has a live uplink to the dialer's node, the reverse leg
// rides the forward leg's ACCEPT and the dialer registers it itself (one SIDR
// exchange per connection); otherwise the acceptor opens it with a
// reciprocal request. Every message
// names the receiver's SRQ and carries the receiver's tag in the immediate
// data; a receiver drops messages whose tag names none of its connections
// (misdelivery after SRQ-number reuse). Close sends an in-band FIN as the
// last message; the receiver then unregisters, the sender drops its uplink
// reference, and an unused uplink is disconnected and its INI destroyed
// after TIMEWAIT_EXIT. CloseWrite half-closes: its FIN, flagged HALF, ends
// our data while the leg stays for the peer's credits until Close.
// Endpoint.StopAccepting ends the listening part alone (a closed
// net.Listener's part), leaving the accepted connections to run;
// Endpoint.ResumeAccepting undoes it. Dead
// peers are found by a DREQ on the physical link,
// by send errors, and by keepalives with an idle timeout (Config.Heartbeat,
// Config.IdleTimeout); a sender whose INI failed rebuilds it and moves its
// connections over (REPLACES_TGT, MOVE). When the device goes away (the
// RDMA CM's DEVICE_REMOVAL) or fails for good (the device's DEVICE_FATAL
// event), every connection fails with ErrDeviceRemoved and the endpoint closes itself,
// leaving nothing of the process on the device. Send returns once its message is
// posted, as an RC send does, so one goroutine streams; the engine keeps
// each message until its completion and, across a recovery, posts the
// connection's unfinished ones again, in order, before anything new. Data
// messages are numbered, and a receiver drops a second copy
// (Stats.Duplicates), so Recv sees every message once, in the order its
// connection's Sends posted them.
//
// Flow control is by credits per connection: a receiver holds at most
// Config.RecvWindow messages that Recv has not taken, and its sender,
// told that window when the leg is set up, waits in Send once it has that
// many outstanding. The receiver returns credits in-band, a running count of
// messages taken, every half window, and what it took below that once the
// sender waits for it and the application takes no more for a moment (a
// timer of 200 us, doubling); a peer that sends past twice its window
// fails the connection with ErrProtocol. All connections to a node
// share one INI, whose send queue is a device limit: a Send that finds it
// full waits until completions free a slot (Stats.SendQueueFull).
//
// Send and Recv do not allocate per message once a connection is warm:
// frames, received copies (the SRQ's buffer is reposted at once), queue
// slots and completion channels are reused. What remains is a goroutine
// per credit return, one every half window.
//
// The engine talks to the kernel only through internal/kernel's narrow
// seam, which has two sides. With Config.Process nil, NewEndpoint opens a
// real RDMA device (Config.Device, or the device that holds Addr's IP)
// through libibverbs and librdmacm, owns it, and closes it in Close. The
// device must have XRC: on one without it (soft-RoCE, siw, iWARP devices)
// NewEndpoint fails with an error matching ErrNotSupported that names the
// device and the reason, having released everything it opened; without
// Linux or cgo it always fails so. On a device, an endpoint registers its
// SRQ's receive slots, 32 of Config.MaxMessageSize plus 5 bytes (about 32
// MiB at the default 1 MiB; the endpoint's senders learn the size, since a
// longer message would fail the sender's INI), and
// 8 MiB of send memory per INI. With Config.Process set, the endpoint
// runs on an in-memory kernel that follows the kernel's XRC and RDMA CM
// semantics rule for rule, exported as package memfabric, so that code
// built on this package can be tested without RDMA hardware. No machine
// here has an XRC device: the engine is proven on the in-memory kernel and
// on the real kernel CM with in-memory QPs (soft-RoCE carries every CM
// exchange); its tests on the real device skip, saying why, where the
// device has no XRC.
//
// Other pieces:
//
//   - OpenDomainFile: the node's domain file (private 0700 directory, 0600
//     file, created once under flock with O_CREAT|O_EXCL) holding the random
//     64-bit domain id that names the kernel XRCD on the wire.
//   - The acceptor (acceptor.go): the receiving process's "open new or share existing"
//     decision for PHYS_REQ (create a TGT) and VIRT_REQ (join an existing
//     TGT), and MOVEs of existing legs onto a rebuilt uplink. Opening a TGT
//     by number is always verified (state, dest QPN, address) because
//     numbers are reused; rejects never leave a reference behind.
//   - internal/wire: the versioned private-data codec.
package xrc
