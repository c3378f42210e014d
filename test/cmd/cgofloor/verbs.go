//go:build linux && cgo

package main

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <rdma/rdma_cma.h>
#include <rdma/rdma_verbs.h>

enum { MSG = 64, RECVS = 8 };

static struct rdma_cm_id *listen_id, *id;
static struct ibv_mr *mr;
static char bufs[2][MSG]; // [0] receives, [1] sends
static int consumed;      // receives taken since the last post

static int fail(void) { return errno ? -errno : -EIO; }

// floor_setup connects (or, as server, accepts one connection) with a QP
// whose CQs librdmacm creates; every send is signaled and inline.
static int floor_setup(int server, const char *host, const char *port) {
	struct rdma_addrinfo hints, *ai;
	struct ibv_qp_init_attr qa;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	if (server)
		hints.ai_flags = RAI_PASSIVE;
	if (rdma_getaddrinfo(host, port, &hints, &ai))
		return fail();
	memset(&qa, 0, sizeof qa);
	qa.cap.max_send_wr = qa.cap.max_recv_wr = 2 * RECVS;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = MSG;
	qa.sq_sig_all = 1;
	int rc = rdma_create_ep(server ? &listen_id : &id, ai, NULL, &qa);
	rdma_freeaddrinfo(ai);
	if (rc)
		return fail();
	if (server && (rdma_listen(listen_id, 0) || rdma_get_request(listen_id, &id)))
		return fail();
	if (!(mr = rdma_reg_msgs(id, bufs, sizeof bufs)))
		return fail();
	for (int i = 0; i < RECVS; i++)
		if (rdma_post_recv(id, NULL, bufs[0], MSG, mr))
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
	if (listen_id)
		rdma_destroy_ep(listen_id);
}

// floor_send puts consumed receive buffers back, reaps send completions and
// posts one inline send: all a hop needs besides polling, in one call.
static int floor_send(void) {
	struct ibv_wc wc;
	for (; consumed > 0; consumed--)
		if (rdma_post_recv(id, NULL, bufs[0], MSG, mr))
			return fail();
	while (ibv_poll_cq(id->send_cq, 1, &wc) > 0)
		if (wc.status != IBV_WC_SUCCESS)
			return -EIO;
	struct ibv_sge sge = {(uintptr_t)bufs[1], MSG, mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	return ibv_post_send(id->qp, &wr, &bad) ? fail() : 0;
}

static int64_t now_ns(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

// floor_poll looks for a receive completion, spinning up to spin_ns: 1 when
// one came, 0 when none, <0 on an error.
static int floor_poll(int64_t spin_ns) {
	struct ibv_wc wc;
	int64_t end = 0;
	for (;;) {
		int n = ibv_poll_cq(id->recv_cq, 1, &wc);
		if (n < 0)
			return -EIO;
		if (n > 0) {
			consumed++;
			return wc.status == IBV_WC_SUCCESS ? 1 : -EIO;
		}
		if (end == 0)
			end = now_ns() + spin_ns;
		else if (now_ns() >= end)
			return 0;
	}
}

// floor_loop runs n round trips in C; rtt_ns (or NULL) gets the client's
// round-trip times.
static int floor_loop(int server, int n, int64_t *rtt_ns) {
	for (int i = 0; i < n; i++) {
		int64_t t = now_ns();
		int rc;
		if (!server && (rc = floor_send()) < 0)
			return rc;
		while ((rc = floor_poll(INT64_MAX / 2)) == 0)
			;
		if (rc < 0 || (server && (rc = floor_send()) < 0))
			return rc;
		if (rtt_ns)
			rtt_ns[i] = now_ns() - t;
	}
	return 0;
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

func setup(server bool, host, port string) error {
	s := C.int(0)
	if server {
		s = 1
	}
	ch, cp := C.CString(host), C.CString(port)
	defer C.free(unsafe.Pointer(ch))
	defer C.free(unsafe.Pointer(cp))
	if rc := C.floor_setup(s, ch, cp); rc < 0 {
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

func pollRecv(spin time.Duration) bool {
	rc := C.floor_poll(C.int64_t(spin))
	check(rc)
	return rc > 0
}

// loopC runs n round trips inside one C call and appends the client's
// round-trip times to rtts (nil: untimed).
func loopC(server bool, n int, rtts []time.Duration) []time.Duration {
	s := C.int(0)
	if server {
		s = 1
	}
	ns := make([]C.int64_t, n)
	check(C.floor_loop(s, C.int(n), unsafe.SliceData(ns)))
	if rtts == nil {
		return nil
	}
	for _, v := range ns {
		rtts = append(rtts, time.Duration(v))
	}
	return rtts
}
