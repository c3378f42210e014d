// Package xrc is the XRC engine: how processes on a node share one XRC
// domain so that a process sends to every process of a remote node over one
// INI QP, and a node keeps one TGT QP per remote sender, shared by every local
// receiver through the kernel's handle count (xrc-protocol.md).
//
// It talks to the kernel only through internal/kernel's Kernel seam, so the
// same code runs on real verbs + rdmacm and on internal/kernel/model, which is
// where it is tested (no machine here has an XRC device).
//
// Pieces so far:
//
//   - OpenDomainFile: the node's domain file (private 0700 directory, 0600
//     file, created once under flock with O_CREAT|O_EXCL) holding the random
//     64-bit domain id that names the kernel XRCD on the wire.
//   - Acceptor: the receiving process's "open new or share existing"
//     decision for PHYS_REQ (connected-mode XRC exchange: create a TGT) and
//     VIRT_REQ (SIDR: join an existing TGT). Each process holds at most one
//     kernel handle per TGT with a process-local use count over it; opening a
//     TGT by number is always verified (state, dest QPN, address) because
//     numbers are reused; rejects never leave a reference behind; the handle
//     is destroyed when the local count reaches zero.
//   - internal/wire: the versioned private-data codec.
package xrc
