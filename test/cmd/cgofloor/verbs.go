//go:build linux && cgo

package main

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

// Ping-pong: 8 receives, every send signaled and inline (ib_send_lat on
// soft-RoCE inlines nothing). Streaming (-bw): 512 receives and 128 sends in
// flight as ib_send_bw by default, one in BW_SIG signaled (ib_send_bw: one
// in 100 up to 8 KiB, every one above). Every receive lands in the same buffer: a floor needs the
// copy, not the data.
enum { PING_RECVS = 8, BW_RECVS = 512, BW_SENDS = 128, BW_SIG = 64, INLINE = 64 };

static struct rdma_cm_id *listen_id, *id;
static struct ibv_mr *mr;
static char *bufs;      // [0, msg) receives, [msg, 2*msg) sends
static int msg, recvs;  // message size and receives posted (set by floor_setup)
static int consumed;    // receives taken since the last post

static int fail(void) { return errno ? -errno : -EIO; }

// floor_setup connects (or, as server, accepts one connection) with a QP
// whose CQs librdmacm creates, for messages of size bytes; stream sizes the
// queues for streaming.
static int floor_setup(int server, const char *host, const char *port, int size, int stream) {
	struct rdma_addrinfo hints, *ai;
	struct ibv_qp_init_attr qa;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(host, port, &hints, &ai))
		return fail();
	msg = size;
	recvs = stream ? BW_RECVS : PING_RECVS;
	memset(&qa, 0, sizeof qa);
	qa.cap.max_send_wr = stream ? BW_SENDS : 2 * PING_RECVS;
	qa.cap.max_recv_wr = recvs;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = INLINE;
	int rc = rdma_create_ep(server ? &listen_id : &id, ai, NULL, &qa);
	rdma_freeaddrinfo(ai);
	if (rc)
		return fail();
	if (server && (rdma_listen(listen_id, 0) || rdma_get_request(listen_id, &id)))
		return fail();
	if (!(bufs = calloc(2, msg)))
		return -ENOMEM;
	if (!(mr = rdma_reg_msgs(id, bufs, 2 * msg)))
		return fail();
	for (int i = 0; i < recvs; i++)
		if (rdma_post_recv(id, NULL, bufs, msg, mr))
			return fail();
	if (server ? rdma_accept(id, NULL) : rdma_connect(id, NULL))
		return fail();
	return 0;
}

static void floor_teardown(void) {
	if (id) {
		rdma_disconnect(id);
		if (mr)
			rdma_dereg_mr(mr);
		rdma_destroy_ep(id);
	}
	free(bufs);
	if (listen_id)
		rdma_destroy_ep(listen_id);
}

// repost puts consumed receive buffers back.
static int repost(void) {
	for (; consumed > 0; consumed--)
		if (rdma_post_recv(id, NULL, bufs, msg, mr))
			return fail();
	return 0;
}

// reap polls the send CQ without waiting: the wr_id of the last signaled
// send that completed (sends complete in order), 0 if none did, <0 on an
// error.
static int64_t reap(void) {
	struct ibv_wc wc[8];
	int64_t last = 0;
	int n;
	while ((n = ibv_poll_cq(id->send_cq, 8, wc)) > 0)
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				return -EIO;
			last = (int64_t)wc[i].wr_id;
		}
	return n < 0 ? -EIO : last;
}

// post sends one message of len bytes (inline when it fits), signaled or
// not, tagged wrid.
static int post(int len, int signaled, int64_t wrid) {
	struct ibv_sge sge = {(uintptr_t)bufs + msg, len, mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = (uint64_t)wrid;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = (signaled ? IBV_SEND_SIGNALED : 0) | (len <= INLINE ? IBV_SEND_INLINE : 0);
	return ibv_post_send(id->qp, &wr, &bad) ? fail() : 0;
}

// floor_send puts consumed receive buffers back, reaps send completions and
// posts one signaled send: all a hop needs besides polling, in one call.
static int floor_send(void) {
	int rc = repost();
	if (rc < 0 || (rc = (int)reap()) < 0)
		return rc;
	return post(msg, 1, 1);
}

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// floor_last_send waits, up to timeout_ns, for the completion of the last
// send of a ping-pong (floor_send reaped every earlier one before posting
// it): the server's last reply, which a teardown right after the post
// could flush before the device sent it, leaving the client waiting.
static int floor_last_send(int64_t timeout_ns) {
	int64_t end = now_ns() + timeout_ns, last;
	while ((last = reap()) == 0)
		if (now_ns() > end)
			return -ETIMEDOUT;
	return last < 0 ? (int)last : 0;
}

// floor_poll looks for receive completions, up to max of them, spinning up
// to spin_ns: how many came (0: none), <0 on an error.
static int floor_poll(int64_t spin_ns, int max) {
	struct ibv_wc wc[16];
	int64_t end = 0;
	max = max < 16 ? max : 16;
	for (;;) {
		int n = ibv_poll_cq(id->recv_cq, max, wc);
		if (n < 0)
			return -EIO;
		if (n > 0) {
			consumed += n;
			for (int i = 0; i < n; i++)
				if (wc[i].status != IBV_WC_SUCCESS)
					return -EIO;
			return n;
		}
		if (end == 0)
			end = now_ns() + spin_ns;
		else if (now_ns() >= end)
			return 0;
	}
}

static int floor_wait_event(void);

// floor_loop runs n round trips in C, each wait polling or, with events,
// sleeping on completion events; rtt_ns (or NULL) gets the client's
// round-trip times.
static int floor_loop(int server, int n, int64_t *rtt_ns, int events) {
	for (int i = 0; i < n; i++) {
		int64_t t = now_ns();
		int rc;
		if (!server && (rc = floor_send()) < 0)
			return rc;
		if (events)
			rc = floor_wait_event();
		else
			while ((rc = floor_poll(INT64_MAX / 2, 1)) == 0)
				;
		if (rc < 0 || (server && (rc = floor_send()) < 0))
			return rc;
		if (rtt_ns)
			rtt_ns[i] = now_ns() - t;
	}
	return 0;
}

// floor_event_fd is the receive CQ's completion channel (librdmacm made
// one for the CQ it made), for -events.
static int floor_event_fd(void) { return id->recv_cq_channel->fd; }

// floor_arm_poll is floor_poll without spinning that, finding nothing, arms
// the receive CQ and looks once more (a completion may have come first): 1
// if a receive came, 0 if armed with nothing there, <0 on an error.
static int floor_arm_poll(void) {
	int n = floor_poll(0, 1);
	if (n != 0)
		return n;
	if (ibv_req_notify_cq(id->recv_cq, 0))
		return fail();
	return floor_poll(0, 1);
}

// floor_set_blocking makes the receive CQ's channel blocking (the loop in
// C sleeps in its read, as ib_send_lat -e does) or not (the Go way waits
// for it in the netpoller).
static int floor_set_blocking(int blocking) {
	int fd = id->recv_cq_channel->fd, fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, blocking ? fl & ~O_NONBLOCK : fl | O_NONBLOCK) < 0)
		return fail();
	return 0;
}

// floor_take_event reads and acknowledges one completion event of the
// receive CQ's channel: 1 if there was one, 0 if none (a non-blocking
// channel), <0 on an error.
static int floor_take_event(void) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(id->recv_cq_channel, &cq, &ctx))
		return errno == EAGAIN ? 0 : fail();
	ibv_ack_cq_events(cq, 1);
	return 1;
}

// floor_wait_event sleeps until a receive completes (-events, in C): arm
// and look, then block in the channel's read and look again.
static int floor_wait_event(void) {
	int rc;
	while ((rc = floor_arm_poll()) == 0)
		if ((rc = floor_take_event()) < 0)
			return rc;
	return rc;
}

// floor_stream_send posts one message of the stream: the nth (from 1) of
// total, signaled every BW_SIG and at the end. It first reaps completions,
// waiting while BW_SENDS are in flight; *done tracks the last completed.
static int floor_stream_send(int64_t nth, int64_t total, int64_t *done) {
	while (nth - 1 - *done >= BW_SENDS) {
		int64_t last = reap();
		if (last < 0)
			return (int)last;
		if (last > *done)
			*done = last;
	}
	int sig = nth % BW_SIG == 0 || nth == total;
	return post(msg, sig, nth);
}

// floor_stream_recv takes what came, up to left messages, spinning up to
// spin_ns, and reposts the buffers at once: how many came, <0 on an error.
static int floor_stream_recv(int64_t spin_ns, int left) {
	int n = floor_poll(spin_ns, left);
	if (n > 0) {
		int rc = repost();
		if (rc < 0)
			return rc;
	}
	return n;
}

// floor_stream_ack sends the receiver's 1-byte acknowledgement, or waits
// for it (as the sender): the stream's end.
static int floor_stream_ack(int server) {
	if (server) {
		int rc = post(1, 1, 1);
		int64_t last = 0;
		while (rc == 0 && last == 0)
			if ((last = reap()) < 0)
				rc = (int)last;
		return rc;
	}
	int n;
	while ((n = floor_poll(INT64_MAX / 2, 1)) == 0)
		;
	return n < 0 ? n : repost();
}

// floor_stream runs a stream of n messages in one C call: the sender posts
// and reaps, the receiver polls and reposts; then the acknowledgement.
static int floor_stream(int server, int64_t n) {
	int64_t done = 0;
	int rc = 0;
	if (server) {
		for (int64_t got = 0; got < n && rc >= 0; got += rc)
			rc = floor_stream_recv(INT64_MAX / 2, n - got > 16 ? 16 : (int)(n - got));
	} else {
		for (int64_t i = 1; i <= n && rc >= 0; i++)
			rc = floor_stream_send(i, n, &done);
		while (rc >= 0 && done < n) {
			int64_t last = reap();
			if (last < 0)
				rc = (int)last;
			else if (last > done)
				done = last;
		}
	}
	return rc < 0 ? rc : floor_stream_ack(server);
}
*/
import "C"

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

func cbool(b bool) C.int {
	if b {
		return 1
	}
	return 0
}

// setup connects for messages of size bytes, its queues sized for a
// stream or for a ping-pong.
func setup(server bool, host, port string, size int, stream bool) error {
	ch, cp := C.CString(host), C.CString(port)
	defer C.free(unsafe.Pointer(ch))
	defer C.free(unsafe.Pointer(cp))
	if rc := C.floor_setup(cbool(server), ch, cp, C.int(size), cbool(stream)); rc < 0 {
		return fmt.Errorf("connect %s:%s: %w", host, port, syscall.Errno(-rc))
	}
	return nil
}

func teardown() { C.floor_teardown() }

func check(rc C.int) {
	if rc < 0 {
		fmt.Fprintln(os.Stderr, "cgofloor:", syscall.Errno(-rc))
		os.Exit(1)
	}
}

func send() { check(C.floor_send()) }

// lastSend waits for the last send of a ping-pong to complete.
func lastSend() { check(C.floor_last_send(C.int64_t(time.Second))) }

func pollRecv(spin time.Duration) bool {
	rc := C.floor_poll(C.int64_t(spin), 1)
	check(rc)
	return rc > 0
}

// loopC runs n round trips inside one C call and appends the client's
// round-trip times to rtts (nil: untimed).
func loopC(server bool, n int, rtts []time.Duration) []time.Duration {
	ns := make([]C.int64_t, n)
	check(C.floor_loop(cbool(server), C.int(n), unsafe.SliceData(ns), 0))
	return appendRTTs(rtts, ns)
}

// loopEventsC is loopC sleeping on completion events in C (-events).
func loopEventsC(server bool, n int, rtts []time.Duration) []time.Duration {
	check(C.floor_set_blocking(1))
	defer func() { check(C.floor_set_blocking(0)) }()
	ns := make([]C.int64_t, n)
	check(C.floor_loop(cbool(server), C.int(n), unsafe.SliceData(ns), 1))
	return appendRTTs(rtts, ns)
}

// appendRTTs appends the C loop's round-trip times to rtts (nil: untimed).
func appendRTTs(rtts []time.Duration, ns []C.int64_t) []time.Duration {
	if rtts == nil {
		return nil
	}
	for _, v := range ns {
		rtts = append(rtts, time.Duration(v))
	}
	return rtts
}

func eventFD() int { return int(C.floor_event_fd()) }

// armPoll looks for a receive and, finding none, arms the CQ and looks
// again, in one C call.
func armPoll() bool {
	rc := C.floor_arm_poll()
	check(rc)
	return rc > 0
}

// takeEvent reads and acknowledges one completion event without blocking:
// whether there was one.
func takeEvent() bool {
	rc := C.floor_take_event()
	check(rc)
	return rc > 0
}

// streamC runs a stream of n messages inside one C call.
func streamC(server bool, n int) { check(C.floor_stream(cbool(server), C.int64_t(n))) }

// streamSend posts the nth message (from 1) of total, waiting while too many
// are in flight; done is the last completed one.
func streamSend(nth, total int, done *int64) {
	check(C.floor_stream_send(C.int64_t(nth), C.int64_t(total), (*C.int64_t)(unsafe.Pointer(done))))
}

// streamRecv takes up to max messages, spinning up to spin, and reposts
// their buffers: how many came.
func streamRecv(spin time.Duration, max int) int {
	rc := C.floor_stream_recv(C.int64_t(spin), C.int(max))
	check(rc)
	return int(rc)
}

// streamReap is how far the sender's completions have come.
func streamReap(done *int64) {
	last := C.reap()
	check(C.int(min(last, 0)))
	*done = max(*done, int64(last))
}

func streamAck(server bool) { check(C.floor_stream_ack(cbool(server))) }
