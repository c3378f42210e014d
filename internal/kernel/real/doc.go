// Package real is the kernel.Kernel on a real RDMA device: the CM half is
// internal/kernel/kcm (librdmacm through package rdmacm, shared with
// internal/kernel/hybrid), the verbs half is package verbs: XRC domains by
// file (ibv_open_xrcd), XRC SRQs, INI QPs (XRC_SEND, PD.CreateQP), TGT QPs
// (CreateXRCRecvQP) and shared TGT handles (ibv_open_qp), transitions with
// the attributes of rdma_init_qp_attr trimmed to what each XRC type accepts
// (verbs.AllowedMask) and min_rnr_timer fixed, sends naming a remote SRQ,
// and completions polled from per-INI send CQs and per-SRQ receive CQs.
//
// On a device without XRC (soft-RoCE, siw, ...) XRC reports false and
// OpenXRCD fails with an error matching verbs.ErrNotSupported; CheckXRC says
// why in one line, and reports a device that claims XRC but cannot open a
// domain as an error of its own.
//
// Linux with cgo only; elsewhere the package exports nothing (it holds only
// the INIs' send ring, sendring.go, which builds everywhere).
package real
