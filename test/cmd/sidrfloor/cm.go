//go:build linux && cgo

package main

/*
#cgo LDFLAGS: -lrdmacm
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <arpa/inet.h>
#include <rdma/rdma_cma.h>

// The listener and the dialer have their own event channels, as two
// processes would. SIDR private data at the budgets (180 and 136 bytes).
static struct rdma_event_channel *lch, *dch;
static struct rdma_cm_id *listener, *dialer, *accepted;
static struct sockaddr_in dst;
static char req[180], rep[136];

static int fail(void) { return errno ? -errno : -EIO; }

static int sf_setup(const char *ip, int port) {
	memset(&dst, 0, sizeof dst);
	dst.sin_family = AF_INET;
	dst.sin_port = htons(port);
	if (inet_pton(AF_INET, ip, &dst.sin_addr) != 1)
		return -EINVAL;
	if (!(lch = rdma_create_event_channel()) || !(dch = rdma_create_event_channel()))
		return fail();
	if (rdma_create_id(lch, &listener, NULL, RDMA_PS_UDP) ||
	    rdma_bind_addr(listener, (struct sockaddr *)&dst) || rdma_listen(listener, 64))
		return fail();
	return 0;
}

// sf_nonblock sets both channels non-blocking (the Go way waits in the
// netpoller and reads an event once the descriptor is readable) or blocking
// (the C way, and resolving).
static int sf_nonblock(int on) {
	int fds[2] = {lch->fd, dch->fd};
	for (int i = 0; i < 2; i++) {
		int fl = fcntl(fds[i], F_GETFL);
		if (fl < 0 || fcntl(fds[i], F_SETFL, on ? fl | O_NONBLOCK : fl & ~O_NONBLOCK))
			return fail();
	}
	return 0;
}
static int sf_lfd(void) { return lch->fd; }
static int sf_dfd(void) { return dch->fd; }

// sf_event takes the next event of ch: 0 if it is want (the request's new
// id stored in *out), -EAGAIN on an empty non-blocking channel, another
// negative errno or -1000-event otherwise.
static int sf_event(struct rdma_event_channel *ch, int want, struct rdma_cm_id **out) {
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		return fail();
	int got = e->event;
	if (got == want && out)
		*out = e->id;
	rdma_ack_cm_event(e);
	return got == want ? 0 : -1000 - got;
}
static int sf_levent(void) { return sf_event(lch, RDMA_CM_EVENT_CONNECT_REQUEST, &accepted); }
static int sf_devent(int want) { return sf_event(dch, want, NULL); }

static int sf_create(void) { return rdma_create_id(dch, &dialer, NULL, RDMA_PS_UDP) ? fail() : 0; }
static int sf_resolve_addr(void) { return rdma_resolve_addr(dialer, NULL, (struct sockaddr *)&dst, 2000) ? fail() : 0; }
static int sf_resolve_route(void) { return rdma_resolve_route(dialer, 2000) ? fail() : 0; }
static int sf_connect(void) {
	struct rdma_conn_param p = {.private_data = req, .private_data_len = sizeof req};
	return rdma_connect(dialer, &p) ? fail() : 0;
}
static int sf_accept(void) {
	struct rdma_conn_param p = {.private_data = rep, .private_data_len = sizeof rep, .qp_num = 0x6f5a5a};
	return rdma_accept(accepted, &p) ? fail() : 0;
}
static void sf_destroy(void) {
	rdma_destroy_id(accepted);
	rdma_destroy_id(dialer);
}

static double sf_now(void) {
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

// sf_exchange_c runs one whole exchange in this call, as a C program would,
// its event reads blocking; steps[0..4] get each step's nanoseconds
// (connect, request, accept, reply, destroy). The id is resolved already.
static int sf_exchange_c(double *steps) {
	double t = sf_now(), x;
	int r;
#define LAP(i) (x = sf_now(), steps[i] = x - t, t = x)
	if ((r = sf_connect()))
		return r;
	LAP(0);
	if ((r = sf_levent()))
		return r;
	LAP(1);
	if ((r = sf_accept()))
		return r;
	LAP(2);
	if ((r = sf_devent(RDMA_CM_EVENT_ESTABLISHED)))
		return r;
	LAP(3);
	sf_destroy();
	LAP(4);
#undef LAP
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

// channels are the two event channels' descriptors as Go files, for the
// netpoller (made on the Go way's first exchange). The descriptors are
// non-blocking only while the Go way runs.
type channels struct{ listener, dialer *os.File }

func setup(ip string, port int) (*channels, error) {
	cip := C.CString(ip)
	defer C.free(unsafe.Pointer(cip))
	if r := C.sf_setup(cip, C.int(port)); r != 0 {
		return nil, cerr("set up the listener", r)
	}
	return &channels{}, nil
}

func cerr(op string, r C.int) error {
	if r <= -1000 {
		return fmt.Errorf("%s: unexpected event %d", op, -1000-int(r))
	}
	return fmt.Errorf("%s: %w", op, syscall.Errno(-r))
}

// resolve makes a new dialer id and resolves its address and route, with
// blocking event reads (untimed by the callers' exchange figures); it
// returns the time to create the id and resolve the address, and the time
// to resolve the route.
func resolve() (addr, route time.Duration, err error) {
	t := time.Now()
	if r := C.sf_create(); r != 0 {
		return 0, 0, cerr("rdma_create_id", r)
	}
	if r := C.sf_resolve_addr(); r != 0 {
		return 0, 0, cerr("rdma_resolve_addr", r)
	}
	if r := C.sf_devent(C.RDMA_CM_EVENT_ADDR_RESOLVED); r != 0 {
		return 0, 0, cerr("ADDR_RESOLVED", r)
	}
	addr = time.Since(t)
	if r := C.sf_resolve_route(); r != 0 {
		return 0, 0, cerr("rdma_resolve_route", r)
	}
	if r := C.sf_devent(C.RDMA_CM_EVENT_ROUTE_RESOLVED); r != 0 {
		return 0, 0, cerr("ROUTE_RESOLVED", r)
	}
	return addr, time.Since(t) - addr, nil
}

// exchangeC runs the exchange in one C call.
func exchangeC() (steps [5]time.Duration, err error) {
	var ns [5]C.double
	if r := C.sf_exchange_c(&ns[0]); r != 0 {
		return steps, cerr("exchange in C", r)
	}
	for i := range ns {
		steps[i] = time.Duration(ns[i])
	}
	return steps, nil
}

// exchangeGo runs the exchange from Go, one cgo call per step; the goroutine
// that wants an event waits for it in the netpoller itself (no goroutine
// hands it over), as directly as Go can wait.
func (ch *channels) exchangeGo() (steps [5]time.Duration, err error) {
	if r := C.sf_nonblock(1); r != 0 {
		return steps, cerr("set non-blocking", r)
	}
	defer C.sf_nonblock(0)
	if ch.listener == nil {
		// Duplicates: a file closes what it wraps, and librdmacm closes
		// its own descriptors when the channels are destroyed. (They
		// share the non-blocking flag with librdmacm's.)
		lfd, err := syscall.Dup(int(C.sf_lfd()))
		if err != nil {
			return steps, err
		}
		dfd, err := syscall.Dup(int(C.sf_dfd()))
		if err != nil {
			syscall.Close(lfd)
			return steps, err
		}
		ch.listener = os.NewFile(uintptr(lfd), "listener channel")
		ch.dialer = os.NewFile(uintptr(dfd), "dialer channel")
	}
	t := time.Now()
	lap := func(i int) {
		now := time.Now()
		steps[i], t = now.Sub(t), now
	}
	if r := C.sf_connect(); r != 0 {
		return steps, cerr("rdma_connect", r)
	}
	lap(0)
	if err := wait(ch.listener, func() C.int { return C.sf_levent() }); err != nil {
		return steps, fmt.Errorf("CONNECT_REQUEST: %w", err)
	}
	lap(1)
	if r := C.sf_accept(); r != 0 {
		return steps, cerr("rdma_accept", r)
	}
	lap(2)
	if err := wait(ch.dialer, func() C.int { return C.sf_devent(C.RDMA_CM_EVENT_ESTABLISHED) }); err != nil {
		return steps, fmt.Errorf("ESTABLISHED: %w", err)
	}
	lap(3)
	C.sf_destroy()
	lap(4)
	return steps, nil
}

// wait reads one event with get once f is readable.
func wait(f *os.File, get func() C.int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var r C.int
	if err := rc.Read(func(uintptr) bool { r = get(); return r != -C.EAGAIN }); err != nil {
		return err
	}
	if r != 0 {
		return cerr("rdma_get_cm_event", r)
	}
	return nil
}
