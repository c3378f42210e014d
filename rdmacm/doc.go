// Package rdmacm binds librdmacm, the RDMA connection manager: IP addresses
// and ports are resolved to RDMA devices and paths, and connections are set
// up with the InfiniBand CM's REQ/REP/RTU exchange (or a SIDR exchange for
// datagrams) on every RDMA transport, soft-RoCE included.
//
// Addresses are netip.AddrPort values. An IPv6 zone ("fe80::1%eth0", or an
// interface index) becomes the sockaddr's scope id, which the kernel needs
// to bind a link-local address; the addresses an id reports carry it back
// as the interface's name.
//
// # Channels, ids and events
//
// An EventChannel owns one goroutine, its pump, which waits for the
// channel's descriptor in Go's netpoller (no goroutine ever blocks in C),
// reads each event, copies it (private data included) and acknowledges it at
// once, and queues it on the ID it belongs to. Each ID has its own unbounded
// queue, read with ID.Event or ID.WaitEvent, so a slow consumer of one id
// never stalls the others and the order of one id's events is kept. A
// CONNECT_REQUEST arrives on the listener's queue and carries the new
// passive ID in Event.ID; whoever receives it owns it.
//
// # QPs
//
// This package creates no QPs. Connect and Accept name the caller's QP by
// number (ConnParam.QPNum): the active side gets CONNECT_RESPONSE, moves its
// QP to INIT again (its first INIT, before Connect, gave the peer no
// access), to RTR and to RTS with the attributes from InitQPAttr and calls
// Establish; the passive side moves its QP before Accept, with the read
// resources it accepts in place of the request's, and gets ESTABLISHED.
// MoveQP does either in one call. Any number works for the CM, so a CM exchange can run with
// made-up numbers, which the tests on soft-RoCE use. Mind the kernel's
// stale-connection table: a QP number in a live connection to a node cannot
// be used for a second one (REJECTED, status 10, and the first connection is
// sent a DREQ).
//
// XRC-typed ids (verbs.QPTypeXRCSend on the initiator, verbs.QPTypeXRCRecv on
// the target listener, PortSpaceIB) come from EventChannel.CreateEndpoint
// (CreateEndpointFrom to resolve from a given local address).
// Datagram ids (PortSpaceUDP) run the SIDR exchange: Connect sends a SIDR
// REQ, Accept answers with a QP number, and the active side's ESTABLISHED
// event carries UDParam.
//
// # Private data
//
// Each CM message has a budget (MaxReqPrivateData and the others), checked
// in Go before the call: ErrPrivateDataTooLong, and the id stays usable. The
// receiver always gets the full budget of the message, zero-padded, so
// protocols carry their own length.
//
// # Errors
//
// Calls fail with a *verbs.OpError naming the librdmacm call, the address and
// the errno; waits that run out of time are timeouts in the net.Error sense.
// Rejections are *RejectError with the CM's reason. On platforms without
// RDMA, or without cgo, everything fails with ErrNotSupported.
package rdmacm
