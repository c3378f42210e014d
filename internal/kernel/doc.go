// Package kernel is the seam between the XRC engine and the kernel: one
// narrow interface (Kernel) for everything kernel-side that the XRC protocol
// needs, per process: XRC domains by file, XRC SRQs, INI and TGT QPs with the
// kernel's shared TGT handles (open = register, destroy = unregister), sends
// naming a remote SRQ, and the RDMA CM exchanges (XRC-typed connected mode and
// SIDR on one port number) with their events.
//
// No machine here has an XRC device, so the engine is proven on
// internal/kernel/model, an in-memory kernel that follows the design's
// kernel facts (an outside note; model's doc lists each rule it keeps) rule
// for rule; the real implementation (verbs + rdmacm) satisfies the same interface.
// Objects are named by opaque handles rather than Go objects so that both
// implementations are plain tables and process death is "close every handle".
package kernel
