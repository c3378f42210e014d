package cm

import (
	"context"
	"time"
)

// transport is what a Conn needs from its queue pair. The RDMA implementation
// sits on verbs and rdmacm; a fake one lets the framing and credit logic run
// under the race detector on machines without RDMA.
//
// Work request ids: send slots are 0..sendSlots-1, receive slots likewise on
// the receive side, one-sided operations use rdmaWRID and keepalive probes
// probeWRID.
// notPostedError is a one-sided operation refused before its post (its
// local region registered on another device): unlike a failed post, which
// means the queue pair broke, it leaves the connection as it was. Not
// ErrInvalid alone: a device's EINVAL from the post matches that too.
type notPostedError struct{ error }

func (e notPostedError) Unwrap() error { return e.error }

type transport interface {
	sendBuf(slot int) []byte
	recvBuf(slot int) []byte
	// postSend sends n bytes of send slot slot. An unsignaled send makes
	// no completion of its own unless it fails; a later signaled one's
	// completion covers it.
	postSend(slot, n int, imm uint32, hasImm, signaled bool) error
	// postRecvs posts the receive slots, in order, as one chain.
	postRecvs(slots []int) error
	// postRDMA posts a signaled RDMA write (or read) of n bytes between
	// local memory and the peer's region. A notPostedError refuses it
	// before the post (a region of another device): the queue pair is fine.
	postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error
	regMem(size int, access Access) (memory, error)
	// maxMessage is the longest work request the device takes, its
	// port's max_msg_sz (1 GiB on mlx5; 8 MiB on Debian 12's rxe, 2 GiB on
	// later kernels'); 0 if unknown. cm holds to it: a device may fail a
	// longer request as it runs, taking the QP to the error state, though
	// Debian 12's rxe enforces only the region's bounds and IB's 2^31.
	maxMessage() int
	// probeTarget is the memory the peer's keepalive probes read; the
	// hello carries it. postProbe posts a signaled RDMA read of the
	// peer's (probeLen bytes), which completes as compProbe.
	probeTarget() probeTarget
	postProbe(peer probeTarget) error
	// poll fills cs with completions. With block it sleeps (never in a C
	// call) until at least one arrives or ctx ends; otherwise it may keep
	// polling for up to spin before it reports none.
	poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error)
	// shutdown moves the QP to the error state: every posted request
	// completes as flushed, which wakes a blocked poll.
	shutdown()
	// interrupt makes the poll blocked now (or else the next one) return
	// with none, once, so that its caller looks at the connection again:
	// Close wakes blocked calls with it and still sends its FIN.
	interrupt()
	// release disconnects, waits (bounded by ctx) for the CM to finish,
	// unless the peer is known to have vanished (then nothing will) or the
	// device was lost (vanished too: nothing is kept), and frees every
	// resource.
	release(ctx context.Context, vanished bool) error
}

type compOp uint8

const (
	compSend compOp = iota
	compRecv
	compRDMA
	compProbe
)

const (
	rdmaWRID  = 1 << 32
	probeWRID = rdmaWRID + 1
)

// probeLen is the length of a keepalive probe's read. A read of 0 bytes
// would need no target, but it is a corner of the spec (the R_Key goes
// unchecked); a read of memory registered for it is the plain case.
const probeLen = 8

type completion struct {
	op     compOp
	slot   int
	n      int
	imm    uint32
	hasImm bool
	// written: the receive was consumed by the peer's RDMA write with
	// immediate data, not a send; n is the write's length, and the
	// receive buffer holds nothing of it.
	written bool
	err     error
}

// memory is registered memory: its bytes, and the keys the device knows it by.
type memory interface {
	bytes() []byte
	addr() uint64
	rkey() uint32
	close() error
}
