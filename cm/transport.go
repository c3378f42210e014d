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
// the receive side, and one-sided operations use rdmaWRID.
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
	// local memory and the peer's region.
	postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error
	regMem(size int, remoteWrite bool) (memory, error)
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
	// unless the peer is known to have vanished (then nothing will), and
	// frees every resource.
	release(ctx context.Context, vanished bool) error
}

type compOp uint8

const (
	compSend compOp = iota
	compRecv
	compRDMA
)

const rdmaWRID = 1 << 32

type completion struct {
	op     compOp
	slot   int
	n      int
	imm    uint32
	hasImm bool
	err    error
}

// memory is registered memory: its bytes, and the keys the device knows it by.
type memory interface {
	bytes() []byte
	addr() uint64
	rkey() uint32
	close() error
}
