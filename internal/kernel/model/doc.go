// Package model is an in-memory kernel: a fabric of nodes (one RDMA device
// each, addressed by IP) running processes, each process a kernel.Kernel. It
// reproduces the kernel semantics of the design's kernel facts (an outside
// note, not in this repository; the rules it keeps are listed below) rule for
// rule, so that the XRC engine can be tested where no XRC device exists (and,
// like gRPC's bufconn, through package xrc/memfabric, so that users can test
// code on top of this library without RDMA):
//
//   - XRC domains are keyed by the inode of the file (the model keeps the
//     file open while the domain lives, as the kernel holds the inode, so an
//     unlinked and recreated file is a second domain); EAGAIN without create,
//     EINVAL for exclusive create of an existing one, EBUSY for closing a
//     handle that still has QPs or SRQs.
//   - TGT QPs have a use count of handles: the creator gets one, every
//     OpenTGT adds one, DestroyQP removes one, the TGT dies with the last.
//   - QP and SRQ numbers are reused (LIFO, lowest-free, or never), so an old
//     number can open the wrong TGT and a stale SRQN can reach a stranger.
//   - The CM: listeners per port space (XRC/IB-RC, TCP, UDP) on one port
//     number; QP-type mismatch is REJECTED 28 unseen by the listener; no
//     listener is REJECTED 8 or SIDR UNREACHABLE 1; SIDR rejects are
//     UNREACHABLE 2; private data budgets (56/196/148/180/136) with EINVAL
//     one byte over and zero padding to the maximum on receipt; ib_cm's
//     stale-connection table keyed by (remote node, remote QPN), checked at
//     REQ time (before the listener lookup) and at REP time, REJECTED 10
//     plus a DREQ to the old connection if it is established (a pending one
//     stays as it was, as ib_send_cm_dreq refuses it); an entry leaves when
//     its id enters timewait (its DREP sent or received) or goes back to
//     idle or is destroyed (cm_remove_remote), not at the DREQ: until the
//     peer answers a DREQ, its number is stale;
//     SIDR never in the table; an established XRC_RECV-typed id is destroyed
//     without a DREQ, every other type sends one.
//   - Sends go from an RTS INI through the TGT it is connected to (RTR or
//     later, connected back to that INI) into any SRQ of the TGT's domain
//     named by the sender; an unknown SRQN fails the send with
//     WCRemInvReqErr, moves the INI to ERR and flushes everything behind it.
//   - An SRQ's receives hold the slot size it was made with; a longer
//     message completes its receive with WCLocLenErr and its send with
//     WCRemInvReqErr, the TGT and the INI to ERR (IB's local length error,
//     a responder class C error, and its NAK).
//   - An INI's send queue holds NodeConfig.SendQueueDepth sends (default
//     256) until their completions are polled; a post beyond that fails with
//     ENOMEM and leaves the QP as it was (mlx5_wq_overflow; not in facts.md).
//   - A move to RESET drops an INI's send completions not yet polled and
//     the sends waiting for a receive, and frees its whole send queue: the
//     provider cleans the QP's entries out of its CQ and resets the queue
//     (mlx5_modify_qp's mlx5_cq_clean and mlx5_init_qp_indices; not in
//     facts.md).
//   - With NodeConfig.SRQReceives, an SRQ holds that many receives posted
//     (a completion, once polled, gives its receive back); a message that
//     finds none is NAKed RNR and retried for ever (rnr_retry 7): it waits
//     at its INI, with every later send of the INI behind it, holding send
//     queue slots, and is delivered once a receive is free; an INI moved to
//     ERR flushes the waiting sends, and one whose TGT, SRQ or node goes
//     fails the first as a post would and flushes the rest (IB's RNR NAK;
//     not in facts.md). Process.PauseReceives stops a process's polls.
//   - Process death (Kill or Close) closes all of the process's handles and
//     CM ids at once, sending what the kernel sends.
//   - A node's power-off (Node.PowerOff) kills its processes without
//     sending anything; a REQ or SIDR REQ to it gets no answer, a DREQ to it
//     times out (DISCONNECTED, TIMEWAIT_EXIT: cma_ib_handler's
//     IB_CM_DREQ_ERROR), a send to it fails with WCRetryExcErr.
//   - A node's device failing for good (Node.FailDevice, IBV_EVENT_DEVICE_FATAL)
//     closes DeviceFatal of each of its processes; the node is off as after
//     a power-off, but its processes live on: destroying works, what
//     takes a firmware command fails with EIO (mlx5's internal error state),
//     and so does what sends a CM message (rdma_connect, rdma_accept,
//     rdma_reject, rdma_establish; a DREQ goes to timewait with no event).
//     A send posted on it, or waiting there for a receive, never completes,
//     not even flushed when its QP moves to ERR, and keeps its send queue
//     slot: mlx5's post_send and poll_cq do not look at the error state,
//     and the kernel's simulated flushes (mlx5_ib_handle_internal_error)
//     are for kernel consumers only.
//
// Simplifications, all deterministic: one mutex per fabric; no timers (a
// retransmitted REQ after a REP-time stale hit is redelivered at once;
// TIMEWAIT_EXIT follows DISCONNECTED without the ~2 s delay; a DREQ to a
// node that is off times out at once, a request to it never; sends waiting
// for a receive are retried after every kernel operation, INIs in the order
// of their nodes' addresses and numbers); SRQs have unlimited posted
// receives unless NodeConfig.SRQReceives says otherwise; a bad SRQN leaves
// the TGT as it was (the mlx5 responder's behaviour is an open point).
package model
