// Package verbs is a Go binding of libibverbs (rdma-core v44): devices,
// protection domains, memory regions, completion queues with completion
// channels, shared receive queues (basic and XRC), XRC domains, queue pairs
// (RC, UC, UD, XRC_SEND, XRC_RECV, shared XRC target handles) and
// asynchronous events.
//
// # Design
//
// No C type appears in the API. Builds without Linux or cgo compile the same
// API, and every call that would reach libibverbs fails with an error
// matching ErrNotSupported, except Close (nil) and accessors (zero values);
// what is Go alone (RequiredMask, AllowedMask, CheckMask, Counts, the
// types' methods) works as ever.
//
// Nothing blocks in C. Completion channels and the device's async fd are
// made non-blocking and waited for in Go's netpoller: CQ.Wait honours its
// context and wakes on Close, and one goroutine per Context pumps async
// events into a channel (Context.AsyncEvents).
//
// The data path crosses into C once per call and does not allocate. Each QP
// and SRQ owns C scratch arrays of work requests and scatter/gather
// elements. PostSend and PostRecv fill them from Go under a per-queue mutex,
// link them into one chain and post it in one call. CQ.Poll reads up to 256
// completions in one call; CQ.PollSpin keeps polling inside that call for a
// short budget, which is what a busy-polling loop wants (no cgo transition
// per empty poll). Registered memory (PD.RegMR) is mapped outside
// the Go heap, so the device can touch it at any time. The kernel pins it
// and counts it against RLIMIT_MEMLOCK unless the process has
// CAP_IPC_LOCK; a registration over the limit fails with ENOMEM and an
// error that says so (check with `ulimit -l`).
//
// Every object has an idempotent Close. Methods of a nil or closed object
// return an error wrapping ErrClosed (with Linux and cgo). An object with live dependents refuses
// to close with EBUSY and stays usable: close QPs before their CQs, SRQs, PD
// and XRC domain, MRs and AHs before their PD, a CQ before its completion
// channel, and everything before the Context. Counts reports the live
// objects of each kind, for leak checks in tests (goxrc's own also print
// where each leaked object was created, recorded while GOXRC_TRACE_OBJECTS=1
// is set). No finalizers are used.
//
// Errors are *OpError values that name the C call and the object, and wrap
// an errno. A few wrap a more specific error: *MaskError (a Modify mask that
// does not fit the QP type and transition), *TypeError (an operation the QP
// type lacks) and *PostError (which work request of a chain failed).
// errors.Is(err, ErrNotSupported) holds for EOPNOTSUPP, ENOSYS and
// EPROTONOSUPPORT, for example for XRC on soft-RoCE, and errors.Is(err,
// os.ErrInvalid) for EINVAL (see OpError).
//
// # QP types and attribute masks
//
// RequiredMask and AllowedMask give the Modify masks of each QP type and
// transition. The XRC types differ from RC: an XRC_SEND (INI) QP has no
// responder side, so no MaxDestRdAtomic or MinRNRTimer; an XRC_RECV (TGT) QP
// has no requester side, so no MaxQPRdAtomic, RetryCnt or RNRRetry. Modify
// checks the mask before it calls the driver.
//
// An XRC_RECV QP is created with Context.CreateXRCRecvQP (or PD.CreateQP
// with Type QPTypeXRCRecv and an XRCD; the PD is not used). Other processes
// that share the domain open it with Context.OpenQP. Each handle counts, and
// the QP lives until its last handle is closed.
//
// # Concurrency
//
// All methods are safe for concurrent use. Posts to one queue are serialised
// (the scratch arrays are per queue). Concurrent Waits on one CQ take turns.
// A channel from NewCompChannel serves one CQ (CQ.Wait); one from
// NewSharedCompChannel serves any number (CompChannel.GetEvents).
package verbs
