//go:build linux && cgo

package main

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

// cmtime's client (rdma-core 44): every step for all connections at once,
// one step after another, on one event channel; QPs from rdma_create_qp
// with librdmacm's own CQs, one send and one receive each.
static struct rdma_event_channel *ch;
static struct rdma_cm_id **ids;
static struct sockaddr_in dst;
static int n;

static int fail(void) { return errno ? -errno : -EIO; }

static int su_setup(const char *ip, int port, int conns) {
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(port);
	if (inet_pton(AF_INET, ip, &dst.sin_addr) != 1)
		return -EINVAL;
	if (!(ch = rdma_create_event_channel()))
		return fail();
	if (!(ids = calloc(conns, sizeof *ids)))
		return -ENOMEM;
	n = conns;
	return 0;
}

static int su_nonblock(void) {
	int fl = fcntl(ch->fd, F_GETFL);
	return fl < 0 || fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK) ? fail() : 0;
}
static int su_fd(void) { return ch->fd; }

static int su_create_id(int i) { return rdma_create_id(ch, &ids[i], NULL, RDMA_PS_TCP) ? fail() : 0; }
static int su_resolve_addr(int i) { return rdma_resolve_addr(ids[i], NULL, (struct sockaddr *)&dst, 2000) ? fail() : 0; }
static int su_resolve_route(int i) { return rdma_resolve_route(ids[i], 2000) ? fail() : 0; }
static int su_create_qp(int i) {
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.cap.max_send_wr = a.cap.max_recv_wr = 1;
	a.cap.max_send_sge = a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = 1;
	return rdma_create_qp(ids[i], NULL, &a) ? fail() : 0;
}
static int su_connect(int i) {
	struct rdma_conn_param p;
	memset(&p, 0, sizeof p);
	p.responder_resources = p.initiator_depth = 1;
	p.retry_count = 5;
	return rdma_connect(ids[i], &p) ? fail() : 0;
}

// su_event takes one event: 0 if it is want, -EAGAIN on an empty
// non-blocking channel, -1000-event for another event, else -errno.
static int su_event(int want) {
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		return fail();
	int got = e->event;
	rdma_ack_cm_event(e);
	return got == want ? 0 : -1000 - got;
}

static double su_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

// su_all_in_c runs the five steps in this one call, as cmtime does, its
// event reads blocking; steps[i] gets step i's nanoseconds.
static int su_all_in_c(double *steps) {
	int (*call[5])(int) = {su_create_id, su_resolve_addr, su_resolve_route, su_create_qp, su_connect};
	int want[5] = {-1, RDMA_CM_EVENT_ADDR_RESOLVED, RDMA_CM_EVENT_ROUTE_RESOLVED, -1, RDMA_CM_EVENT_ESTABLISHED};
	for (int s = 0; s < 5; s++) {
		double t = su_now();
		for (int i = 0; i < n; i++) {
			int r = call[s](i);
			if (r)
				return r;
		}
		for (int i = 0; want[s] >= 0 && i < n; i++) {
			int r = su_event(want[s]);
			if (r)
				return r;
		}
		steps[s] = su_now() - t;
	}
	return 0;
}

static void su_close(void) {
	for (int i = 0; i < n; i++)
		if (ids[i])
			rdma_disconnect(ids[i]);
	struct timespec d = {0, 500 * 1000 * 1000}; // the server's DREPs
	nanosleep(&d, NULL);
	for (int i = 0; i < n; i++) {
		if (ids[i]) {
			if (ids[i]->qp)
				rdma_destroy_qp(ids[i]);
			rdma_destroy_id(ids[i]);
		}
	}
	rdma_destroy_event_channel(ch);
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

var stepNames = [5]string{"create id", "resolve addr", "resolve route", "create qp", "connect"}

func setup(ip string, port, conns int) error {
	cip := C.CString(ip)
	defer C.free(unsafe.Pointer(cip))
	if r := C.su_setup(cip, C.int(port), C.int(conns)); r != 0 {
		return cerr("set up", r)
	}
	return nil
}

func cerr(op string, r C.int) error {
	if r <= -1000 {
		return fmt.Errorf("%s: unexpected event %d", op, -1000-int(r))
	}
	return fmt.Errorf("%s: %w", op, syscall.Errno(-r))
}

// allInC runs cmtime's steps in one C call.
func allInC() (steps [5]time.Duration, err error) {
	var ns [5]C.double
	if r := C.su_all_in_c(&ns[0]); r != 0 {
		return steps, cerr("in C", r)
	}
	for i := range ns {
		steps[i] = time.Duration(ns[i])
	}
	return steps, nil
}

// fromGo runs the same steps from one goroutine, one cgo call per call and
// connection, events awaited in the netpoller.
func fromGo(conns int) (steps [5]time.Duration, err error) {
	if r := C.su_nonblock(); r != 0 {
		return steps, cerr("set non-blocking", r)
	}
	// A duplicate: the file closes what it wraps, and librdmacm closes
	// its own descriptor when the channel is destroyed.
	fd, err := syscall.Dup(int(C.su_fd()))
	if err != nil {
		return steps, err
	}
	f := os.NewFile(uintptr(fd), "rdma_cm event channel")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return steps, err
	}
	calls := [5]func(C.int) C.int{
		func(i C.int) C.int { return C.su_create_id(i) },
		func(i C.int) C.int { return C.su_resolve_addr(i) },
		func(i C.int) C.int { return C.su_resolve_route(i) },
		func(i C.int) C.int { return C.su_create_qp(i) },
		func(i C.int) C.int { return C.su_connect(i) },
	}
	wants := [5]C.int{-1, C.RDMA_CM_EVENT_ADDR_RESOLVED, C.RDMA_CM_EVENT_ROUTE_RESOLVED, -1, C.RDMA_CM_EVENT_ESTABLISHED}
	for s, call := range calls {
		t := time.Now()
		for i := 0; i < conns; i++ {
			if r := call(C.int(i)); r != 0 {
				return steps, cerr(stepNames[s], r)
			}
		}
		for got := 0; wants[s] >= 0 && got < conns; {
			var r C.int
			err := rc.Read(func(uintptr) bool {
				for got < conns {
					if r = C.su_event(wants[s]); r != 0 {
						return r != -C.EAGAIN
					}
					got++
				}
				return true
			})
			if err != nil {
				return steps, err
			}
			if r != 0 && r != -C.EAGAIN {
				return steps, cerr(stepNames[s], r)
			}
		}
		steps[s] = time.Since(t)
	}
	return steps, nil
}

func closeAll() { C.su_close() }
