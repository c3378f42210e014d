//go:build linux && cgo

package rdmacm

/*
#cgo LDFLAGS: -lrdmacm -libverbs
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

// gx_event is a flat copy of a struct rdma_cm_event, made before the event
// is acknowledged.
typedef struct {
	int event;
	int status;
	uintptr_t ctx;              // id->context: the Go handle
	uintptr_t listen_ctx;       // listen_id->context (CONNECT_REQUEST)
	struct rdma_cm_id *new_id;  // the new id (CONNECT_REQUEST)
	int new_ps;
	int new_qpt;
	int ud;
	uint32_t qp_num;
	uint8_t srq, responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count;
	uint32_t qkey;
	struct ibv_ah_attr ah;
	int pd_len;
	uint8_t pd[256];
} gx_event;

// gx_get_event reads one event without blocking (the descriptor is
// non-blocking: -EAGAIN when none is pending), copies it and acks it.
static int gx_get_event(struct rdma_event_channel *ch, gx_event *out) {
	struct rdma_cm_event *e;
	const void *pd = NULL;
	int len = 0;

	int cause;

	errno = 0;
	if (rdma_get_cm_event(ch, &e))
		return -errno;
	cause = errno;
	memset(out, 0, sizeof(*out));
	out->event = e->event;
	out->status = e->status;
	// librdmacm turns ADDR_RESOLVED and ROUTE_RESOLVED into ADDR_ERROR and
	// ROUTE_ERROR itself when its follow-up queries fail (the device went,
	// a PD could not be made), with status -1 and the cause in errno.
	if (e->status == -1 && cause > 0 &&
	    (e->event == RDMA_CM_EVENT_ADDR_ERROR || e->event == RDMA_CM_EVENT_ROUTE_ERROR))
		out->status = -cause;
	out->ctx = (uintptr_t)e->id->context;
	out->ud = e->id->qp_type == IBV_QPT_UD;
	if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
		out->new_id = e->id;
		out->listen_ctx = e->listen_id ? (uintptr_t)e->listen_id->context : 0;
		out->new_ps = e->id->ps;
		out->new_qpt = e->id->qp_type;
	}
	if (e->event != RDMA_CM_EVENT_MULTICAST_JOIN && e->event != RDMA_CM_EVENT_MULTICAST_ERROR) {
		if (out->ud) {
			out->qp_num = e->param.ud.qp_num;
			out->qkey = e->param.ud.qkey;
			out->ah = e->param.ud.ah_attr;
			pd = e->param.ud.private_data;
			len = e->param.ud.private_data_len;
		} else {
			out->qp_num = e->param.conn.qp_num;
			out->srq = e->param.conn.srq;
			out->responder_resources = e->param.conn.responder_resources;
			out->initiator_depth = e->param.conn.initiator_depth;
			out->flow_control = e->param.conn.flow_control;
			out->retry_count = e->param.conn.retry_count;
			out->rnr_retry_count = e->param.conn.rnr_retry_count;
			pd = e->param.conn.private_data;
			len = e->param.conn.private_data_len;
		}
		if (pd && len > 0) {
			memcpy(out->pd, pd, len);
			out->pd_len = len;
		}
	}
	rdma_ack_cm_event(e);
	return 0;
}

typedef struct {
	int family; // 4, 6 or 0
	uint16_t port;
	uint8_t addr[16];
	uint32_t scope; // IPv6: sin6_scope_id, the interface index of the zone
} gx_addr;

static socklen_t gx_to_sockaddr(const gx_addr *a, struct sockaddr_storage *ss) {
	memset(ss, 0, sizeof(*ss));
	if (a->family == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons(a->port);
		memcpy(&s->sin_addr, a->addr, 4);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s = (struct sockaddr_in6 *)ss;
	s->sin6_family = AF_INET6;
	s->sin6_port = htons(a->port);
	memcpy(&s->sin6_addr, a->addr, 16);
	s->sin6_scope_id = a->scope;
	return sizeof(*s);
}

static void gx_from_sockaddr(const struct sockaddr *sa, gx_addr *a) {
	memset(a, 0, sizeof(*a));
	if (!sa)
		return;
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *s = (const struct sockaddr_in *)sa;
		a->family = 4;
		a->port = ntohs(s->sin_port);
		memcpy(a->addr, &s->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *s = (const struct sockaddr_in6 *)sa;
		a->family = 6;
		a->port = ntohs(s->sin6_port);
		memcpy(a->addr, &s->sin6_addr, 16);
		a->scope = s->sin6_scope_id;
	}
}

static int gx_create_id(struct rdma_event_channel *ch, uintptr_t ctx, int ps, struct rdma_cm_id **out) {
	return rdma_create_id(ch, out, (void *)ctx, (enum rdma_port_space)ps) ? -errno : 0;
}

// gx_create_ep makes a bound id of any QP type: rdma_create_ep's passive path
// with a hand-built rdma_addrinfo, then rdma_migrate_id to ch.
static int gx_create_ep(struct rdma_event_channel *ch, uintptr_t ctx, int ps, int qpt, const gx_addr *bind, struct rdma_cm_id **out) {
	struct sockaddr_storage ss;
	struct rdma_addrinfo ai;
	struct rdma_cm_id *id = NULL;
	int err;

	memset(&ai, 0, sizeof(ai));
	ai.ai_flags = RAI_PASSIVE | RAI_NUMERICHOST;
	ai.ai_src_len = gx_to_sockaddr(bind, &ss);
	ai.ai_family = ss.ss_family;
	ai.ai_qp_type = qpt;
	ai.ai_port_space = ps;
	ai.ai_src_addr = (struct sockaddr *)&ss;
	if (rdma_create_ep(&id, &ai, NULL, NULL))
		return -errno;
	if (rdma_migrate_id(id, ch)) {
		err = errno;
		rdma_destroy_id(id);
		return -err;
	}
	id->context = (void *)ctx;
	*out = id;
	return 0;
}

static void gx_set_context(struct rdma_cm_id *id, uintptr_t ctx) { id->context = (void *)ctx; }

static int gx_bind(struct rdma_cm_id *id, const gx_addr *a) {
	struct sockaddr_storage ss;
	gx_to_sockaddr(a, &ss);
	return rdma_bind_addr(id, (struct sockaddr *)&ss) ? -errno : 0;
}

static int gx_resolve_addr(struct rdma_cm_id *id, const gx_addr *src, const gx_addr *dst, int ms) {
	struct sockaddr_storage s, d;
	gx_to_sockaddr(dst, &d);
	if (src->family) {
		gx_to_sockaddr(src, &s);
		return rdma_resolve_addr(id, (struct sockaddr *)&s, (struct sockaddr *)&d, ms) ? -errno : 0;
	}
	return rdma_resolve_addr(id, NULL, (struct sockaddr *)&d, ms) ? -errno : 0;
}

// librdmacm reads the id's device in rdma_resolve_route, and in
// rdma_connect and rdma_accept (their checks of the responder resources and
// initiator depth), with no check that there is one: an id neither resolved
// nor bound to a device's address would crash the process there.
static int gx_resolve_route(struct rdma_cm_id *id, int ms) {
	if (!id->verbs)
		return -EINVAL;
	return rdma_resolve_route(id, ms) ? -errno : 0;
}
static int gx_listen(struct rdma_cm_id *id, int backlog) { return rdma_listen(id, backlog) ? -errno : 0; }
static int gx_establish(struct rdma_cm_id *id) { return rdma_establish(id) ? -errno : 0; }
static int gx_disconnect(struct rdma_cm_id *id) { return rdma_disconnect(id) ? -errno : 0; }
static int gx_destroy(struct rdma_cm_id *id) { return rdma_destroy_id(id) ? -errno : 0; }

static int gx_reject(struct rdma_cm_id *id, const void *pd, int len) {
	return rdma_reject(id, len ? pd : NULL, (uint8_t)len) ? -errno : 0;
}

typedef struct {
	uint32_t qp_num;
	uint8_t responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq;
} gx_conn;

static void gx_fill(struct rdma_conn_param *p, const gx_conn *c, const void *pd, int len) {
	memset(p, 0, sizeof(*p));
	p->private_data = len ? pd : NULL;
	p->private_data_len = (uint8_t)len;
	p->responder_resources = c->responder_resources;
	p->initiator_depth = c->initiator_depth;
	p->flow_control = c->flow_control;
	p->retry_count = c->retry_count;
	p->rnr_retry_count = c->rnr_retry_count;
	p->srq = c->srq;
	p->qp_num = c->qp_num;
}

static int gx_connect(struct rdma_cm_id *id, const gx_conn *c, const void *pd, int len) {
	struct rdma_conn_param p;
	if (!id->verbs) // see gx_resolve_route
		return -EINVAL;
	gx_fill(&p, c, pd, len);
	return rdma_connect(id, &p) ? -errno : 0;
}

static int gx_accept(struct rdma_cm_id *id, const gx_conn *c, const void *pd, int len) {
	struct rdma_conn_param p;
	if (!id->verbs) // see gx_resolve_route
		return -EINVAL;
	gx_fill(&p, c, pd, len);
	return rdma_accept(id, &p) ? -errno : 0;
}

static int gx_init_qp_attr(struct rdma_cm_id *id, int state, struct ibv_qp_attr *attr, int *mask) {
	memset(attr, 0, sizeof(*attr));
	attr->qp_state = (enum ibv_qp_state)state;
	return rdma_init_qp_attr(id, attr, mask) ? -errno : 0;
}

// gx_move_qp moves qp from state `from` through each next state up to `to`
// with the attributes the CM computes, in one call from Go (each cgo call that
// sits in the kernel costs a Go process far more than the call itself).
// rnr > 0 replaces the CM's min_rnr_timer at RTR, resp > 0 its
// max_dest_rd_atomic and init > 0 its max_rd_atomic at RTS, where the CM's
// mask has them; at RTS a retry_cnt over retry_cap is lowered to it. *reached is the state the QP
// is known to be in afterwards (-1 after a failed modify: the driver may have
// moved it); *in_modify tells a failed ibv_modify_qp from a failed
// rdma_init_qp_attr.
static int gx_move_qp(struct rdma_cm_id *id, struct ibv_qp *qp, int from, int to, int rnr,
		      int resp, int init, int retry_cap, int *reached, int *in_modify) {
	*reached = from;
	*in_modify = 0;
	// A QP in INIT takes INIT's attributes again before it goes on, as
	// librdmacm does after a REP: the dialer's INIT came before its CM
	// knew the peer's responder resources, so its access flags let the
	// peer neither read nor write.
	int first = from == IBV_QPS_INIT && to > IBV_QPS_INIT ? IBV_QPS_INIT : from + 1;
	for (int st = first; st <= to; st++) {
		struct ibv_qp_attr attr;
		int mask, r;
		memset(&attr, 0, sizeof(attr));
		attr.qp_state = (enum ibv_qp_state)st;
		if (rdma_init_qp_attr(id, &attr, &mask))
			return -errno;
		// Only where the CM's mask has them: an XRC INI QP has no
		// responder side, and the kernel refuses those bits for it.
		if (st == IBV_QPS_RTR && rnr > 0 && (mask & IBV_QP_MIN_RNR_TIMER))
			attr.min_rnr_timer = rnr;
		if (st == IBV_QPS_RTR && resp > 0 && (mask & IBV_QP_MAX_DEST_RD_ATOMIC))
			attr.max_dest_rd_atomic = resp;
		if (st == IBV_QPS_RTS && init > 0 && (mask & IBV_QP_MAX_QP_RD_ATOMIC))
			attr.max_rd_atomic = init;
		if (st == IBV_QPS_RTS && (mask & IBV_QP_RETRY_CNT) && attr.retry_cnt > retry_cap)
			attr.retry_cnt = retry_cap;
		if ((r = ibv_modify_qp(qp, &attr, mask))) {
			*reached = -1;
			*in_modify = 1;
			// A positive errno, -1 with errno set, or a negative errno:
			// libibverbs and its providers use all three.
			return r > 0 ? -r : r != -1 ? r : errno ? -errno : -EIO;
		}
		*reached = st;
	}
	return 0;
}

static void gx_local(struct rdma_cm_id *id, gx_addr *a) { gx_from_sockaddr(rdma_get_local_addr(id), a); }

// gx_gid_ifindex returns the interface index of the netdev behind the GID
// of id's port equal to addr (a RoCE GID is the netdev's IP address), or 0.
static uint32_t gx_gid_ifindex(struct rdma_cm_id *id, const uint8_t *addr) {
	struct ibv_port_attr pa;
	if (!id->verbs || !id->port_num || ibv_query_port(id->verbs, id->port_num, &pa))
		return 0;
	for (int i = 0; i < pa.gid_tbl_len; i++) {
		struct ibv_gid_entry e;
		if (ibv_query_gid_ex(id->verbs, id->port_num, i, &e, 0) == 0 && memcmp(e.gid.raw, addr, 16) == 0)
			return e.ndev_ifindex;
	}
	return 0;
}
static void gx_peer(struct rdma_cm_id *id, gx_addr *a) { gx_from_sockaddr(rdma_get_peer_addr(id), a); }
static const char *gx_devname(struct rdma_cm_id *id) {
	return id->verbs && id->verbs->device ? ibv_get_device_name(id->verbs->device) : NULL;
}
static struct ibv_context *gx_verbs(struct rdma_cm_id *id) { return id->verbs; }
static int gx_port(struct rdma_cm_id *id) { return id->port_num; }
static int gx_fd(struct rdma_event_channel *ch) { return ch->fd; }
*/
import "C"

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/goxrc/goxrc/internal/cbridge"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/fdpoll"
	"github.com/goxrc/goxrc/verbs"
)

type chanSys struct {
	ch   *C.struct_rdma_event_channel
	fd   *fdpoll.FD
	done chan struct{} // closed when the pump exits
}

type idSys struct {
	cid *C.struct_rdma_cm_id
	// scope: the scope id of the id's bound link-local address, which
	// an accepted id inherits from its listener (see fillScope).
	scope atomic.Uint32
}

func errno(r C.int) error {
	if r == 0 {
		return nil
	}
	return syscall.Errno(-r)
}

func (c *EventChannel) sysOpen() error {
	var ch *C.struct_rdma_event_channel
	err := faults.Check("rdma_create_event_channel")
	if err == nil {
		ch, err = C.rdma_create_event_channel()
	}
	if ch == nil {
		if err == nil {
			err = syscall.ENODEV
		}
		return &verbs.OpError{Op: "rdma_create_event_channel", Addr: "/dev/infiniband/rdma_cm", Err: err}
	}
	fd, err := fdpoll.Open(int(C.gx_fd(ch)), "rdma_cm event channel")
	if err != nil {
		C.rdma_destroy_event_channel(ch)
		return &verbs.OpError{Op: "rdma_create_event_channel", Err: err}
	}
	c.sys = chanSys{ch: ch, fd: fd, done: make(chan struct{})}
	go c.pump()
	return nil
}

// pump is the channel's only reader: it drains the non-blocking descriptor
// whenever the netpoller reports it readable.
func (c *EventChannel) pump() {
	defer close(c.sys.done)
	ev := new(C.gx_event)
	var fatal error
	err := c.sys.fd.Wait(context.Background(), func() bool {
		for {
			if err := faults.Check("rdma_get_cm_event"); err != nil {
				fatal = err
				return true
			}
			r := C.gx_get_event(c.sys.ch, ev)
			switch {
			case r == 0:
				c.dispatch(ev)
			case r == -C.EAGAIN:
				return false
			case r == -C.EINTR:
			default:
				fatal = errno(r)
				return true
			}
		}
	})
	if fatal == nil && !errors.Is(err, fdpoll.ErrClosed) {
		fatal = err
	}
	if fatal != nil && !c.isClosed() {
		// The channel is broken: fail every waiter, and refuse new ids,
		// saying which call failed.
		broken := &verbs.OpError{Op: "rdma_get_cm_event", Err: fatal}
		c.mu.Lock()
		c.broken = broken
		ids := make([]*ID, 0, len(c.ids))
		for _, id := range c.ids {
			ids = append(ids, id)
		}
		c.mu.Unlock()
		for _, id := range ids {
			id.q.close(broken, false)
		}
	}
}

func (c *EventChannel) dispatch(r *C.gx_event) {
	e := Event{Type: EventType(r.event), Status: int(r.status)}
	if r.ud != 0 {
		e.UD = UDParam{QPNum: uint32(r.qp_num), QKey: uint32(r.qkey), AH: ahAttrFromC(&r.ah)}
	} else {
		e.Conn = ConnParam{
			QPNum:              uint32(r.qp_num),
			SRQ:                r.srq != 0,
			ResponderResources: uint8(r.responder_resources),
			InitiatorDepth:     uint8(r.initiator_depth),
			FlowControl:        r.flow_control != 0,
			RetryCount:         uint8(r.retry_count),
			RNRRetryCount:      uint8(r.rnr_retry_count),
		}
	}
	if n := int(r.pd_len); n > 0 {
		e.PrivateData = C.GoBytes(unsafe.Pointer(&r.pd[0]), C.int(n))
	}
	if e.Type != EventConnectRequest {
		if id := c.lookup(uintptr(r.ctx)); id != nil {
			e.ID = id
			if e.Type == EventDeviceRemoval {
				id.deviceRemoved.Store(true)
			}
			id.q.push(e)
		}
		return
	}
	// A connection request: the new C id becomes a new ID, queued on the
	// listener. If the listener is gone, the request is rejected by
	// destroying the new id.
	cid := r.new_id
	c.mu.Lock()
	l := c.ids[uintptr(r.listen_ctx)]
	if l == nil || c.closed {
		c.mu.Unlock()
		C.gx_destroy(cid)
		return
	}
	nid := c.registerLocked(PortSpace(r.new_ps), verbs.QPType(r.new_qpt))
	nid.sys.cid = cid
	nid.sys.scope.Store(l.sys.scope.Load())
	c.mu.Unlock()
	C.gx_set_context(cid, C.uintptr_t(nid.handle))
	e.ID, e.Listener = nid, l
	if !l.q.push(e) {
		nid.Close()
	}
}

func (c *EventChannel) sysStop() {
	c.sys.fd.Close()
	<-c.sys.done
}

func (c *EventChannel) sysDestroy() {
	C.rdma_destroy_event_channel(c.sys.ch)
}

func (id *ID) sysCreate() error {
	var cid *C.struct_rdma_cm_id
	if err := faults.Check("rdma_create_id"); err != nil {
		return err
	}
	if r := C.gx_create_id(id.ch.sys.ch, C.uintptr_t(id.handle), C.int(id.ps), &cid); r != 0 {
		return errno(r)
	}
	id.sys.cid = cid
	return nil
}

// toC converts a, resolving an IPv6 zone to its interface index.
func toC(a netip.AddrPort) (C.gx_addr, error) {
	var g C.gx_addr
	if !a.IsValid() {
		return g, nil
	}
	ip := a.Addr()
	g.port = C.uint16_t(a.Port())
	if ip.Is4() || ip.Is4In6() {
		g.family = 4
		b := ip.Unmap().As4()
		for i := range b {
			g.addr[i] = C.uint8_t(b[i])
		}
		return g, nil
	}
	g.family = 6
	b := ip.As16()
	for i := range b {
		g.addr[i] = C.uint8_t(b[i])
	}
	scope, err := scopeID(ip)
	g.scope = C.uint32_t(scope)
	return g, err
}

func fromC(g *C.gx_addr) netip.AddrPort {
	var ip netip.Addr
	switch g.family {
	case 4:
		ip = netip.AddrFrom4([4]byte{byte(g.addr[0]), byte(g.addr[1]), byte(g.addr[2]), byte(g.addr[3])})
	case 6:
		var b [16]byte
		for i := range b {
			b[i] = byte(g.addr[i])
		}
		ip = withZone(netip.AddrFrom16(b), uint32(g.scope))
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip, uint16(g.port))
}

func (id *ID) sysCreateEP(bind netip.AddrPort) error {
	var cid *C.struct_rdma_cm_id
	if err := checkBindZone(bind.Addr()); err != nil {
		return err
	}
	a, err := toC(bind)
	if err != nil {
		return err
	}
	if err := faults.Check("rdma_create_ep"); err != nil {
		return err
	}
	if r := C.gx_create_ep(id.ch.sys.ch, C.uintptr_t(id.handle), C.int(id.ps), C.int(id.qpType), &a, &cid); r != 0 {
		return errno(r)
	}
	id.sys.cid = cid
	id.sys.scope.Store(uint32(a.scope))
	return nil
}

func (id *ID) sysBind(addr netip.AddrPort) error {
	if err := checkBindZone(addr.Addr()); err != nil {
		return err
	}
	a, err := toC(addr)
	if err != nil {
		return err
	}
	if err := faults.Check("rdma_bind_addr"); err != nil {
		return err
	}
	if r := C.gx_bind(id.sys.cid, &a); r != 0 {
		return errno(r)
	}
	id.sys.scope.Store(uint32(a.scope))
	return nil
}

func (id *ID) sysResolveAddr(src, dst netip.AddrPort, ms int) error {
	s, err := toC(src)
	if err != nil {
		return err
	}
	d, err := toC(dst)
	if err != nil {
		return err
	}
	if err := faults.Check("rdma_resolve_addr"); err != nil {
		return err
	}
	return errno(C.gx_resolve_addr(id.sys.cid, &s, &d, C.int(ms)))
}

func (id *ID) sysResolveRoute(ms int) error {
	if err := faults.Check("rdma_resolve_route"); err != nil {
		return err
	}
	return errno(C.gx_resolve_route(id.sys.cid, C.int(ms)))
}

func (id *ID) sysListen(backlog int32) error {
	if err := faults.Check("rdma_listen"); err != nil {
		return err
	}
	return errno(C.gx_listen(id.sys.cid, C.int(backlog)))
}

func connToC(p *ConnParam) C.gx_conn {
	b := func(v bool) C.uint8_t {
		if v {
			return 1
		}
		return 0
	}
	return C.gx_conn{
		qp_num:              C.uint32_t(p.QPNum),
		responder_resources: C.uint8_t(p.ResponderResources),
		initiator_depth:     C.uint8_t(p.InitiatorDepth),
		flow_control:        b(p.FlowControl),
		retry_count:         C.uint8_t(p.RetryCount),
		rnr_retry_count:     C.uint8_t(p.RNRRetryCount),
		srq:                 b(p.SRQ),
	}
}

func bytesPtr(b []byte) unsafe.Pointer {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Pointer(&b[0])
}

func (id *ID) sysConnect(p *ConnParam) error {
	if err := faults.Check("rdma_connect"); err != nil {
		return err
	}
	c := connToC(p)
	return errno(C.gx_connect(id.sys.cid, &c, bytesPtr(p.PrivateData), C.int(len(p.PrivateData))))
}

func (id *ID) sysAccept(p *ConnParam) error {
	if err := faults.Check("rdma_accept"); err != nil {
		return err
	}
	c := connToC(p)
	return errno(C.gx_accept(id.sys.cid, &c, bytesPtr(p.PrivateData), C.int(len(p.PrivateData))))
}

func (id *ID) sysReject(pd []byte) error {
	if err := faults.Check("rdma_reject"); err != nil {
		return err
	}
	return errno(C.gx_reject(id.sys.cid, bytesPtr(pd), C.int(len(pd))))
}

func (id *ID) sysEstablish() error {
	if err := faults.Check("rdma_establish"); err != nil {
		return err
	}
	return errno(C.gx_establish(id.sys.cid))
}

func (id *ID) sysDisconnect() error {
	if err := faults.Check("rdma_disconnect"); err != nil {
		return err
	}
	return errno(C.gx_disconnect(id.sys.cid))
}

// sysDestroy destroys the C id; an ID without one (tests build such ids
// around a stand-in channel) has nothing to destroy.
func (id *ID) sysDestroy() error {
	if id.sys.cid == nil {
		return nil
	}
	return errno(C.gx_destroy(id.sys.cid))
}

func (id *ID) sysInitQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.QPAttrMask, error) {
	attr := new(C.struct_ibv_qp_attr)
	var mask C.int
	if err := faults.Check("rdma_init_qp_attr"); err != nil {
		return verbs.QPAttr{}, 0, err
	}
	if r := C.gx_init_qp_attr(id.sys.cid, C.int(state), attr, &mask); r != 0 {
		return verbs.QPAttr{}, 0, errno(r)
	}
	return qpAttrFromC(attr), verbs.QPAttrMask(mask), nil
}

func (id *ID) sysMoveQP(qp unsafe.Pointer, from, to verbs.QPState, p MoveParams) (reached int, op string, err error) {
	var r, inModify C.int
	// One C call of rdma_init_qp_attr and ibv_modify_qp per state; a fault
	// fails it as a refused first modify, with the QP left where it was.
	if err := faults.Check("ibv_modify_qp"); err != nil {
		return int(from), "ibv_modify_qp", err
	}
	err = errno(C.gx_move_qp(id.sys.cid, (*C.struct_ibv_qp)(qp), C.int(from), C.int(to), C.int(p.MinRNRTimer),
		C.int(p.ResponderResources), C.int(p.InitiatorDepth), C.int(RetryCountFinite), &r, &inModify))
	op = "rdma_init_qp_attr"
	if inModify != 0 {
		op = "ibv_modify_qp"
	}
	return int(r), op, err
}

func (id *ID) sysDeviceName() string {
	if id.sys.cid == nil {
		return ""
	}
	if s := C.gx_devname(id.sys.cid); s != nil {
		return C.GoString(s)
	}
	return ""
}

func (id *ID) sysPort() uint8 { return uint8(C.gx_port(id.sys.cid)) }

func (id *ID) sysLocalAddr() netip.AddrPort {
	var a C.gx_addr
	C.gx_local(id.sys.cid, &a)
	id.fillScope(&a)
	return fromC(&a)
}

func (id *ID) sysRemoteAddr() netip.AddrPort {
	var a C.gx_addr
	C.gx_peer(id.sys.cid, &a)
	id.fillScope(&a)
	return fromC(&a)
}

// fillScope gives an IPv6 link-local address without a scope id the scope
// of the id's link. The kernel leaves it out of an accepted id's addresses
// and of a peer's; a link-local peer is on the link of the local address,
// the one bound (the listener's, for an accepted id) or resolved. An id
// accepted on the unspecified address has none of those: its link is the
// netdev whose GID on the id's port is its local address.
func (id *ID) fillScope(a *C.gx_addr) {
	if a.family != 6 || a.scope != 0 || a.addr[0] != 0xfe || a.addr[1]&0xc0 != 0x80 {
		return
	}
	if a.scope = C.uint32_t(id.sys.scope.Load()); a.scope != 0 {
		return
	}
	var l C.gx_addr
	C.gx_local(id.sys.cid, &l)
	if a.scope = l.scope; a.scope == 0 && l.family == 6 {
		a.scope = C.gx_gid_ifindex(id.sys.cid, &l.addr[0])
	}
	if a.scope != 0 {
		id.sys.scope.Store(uint32(a.scope))
	}
}

// sysVerbs returns the id's struct ibv_context, or nil.
func (id *ID) sysVerbs() unsafe.Pointer { return unsafe.Pointer(C.gx_verbs(id.sys.cid)) }

// qpAttrFromC converts with verbs' converter when verbs has registered one.
func qpAttrFromC(a *C.struct_ibv_qp_attr) verbs.QPAttr {
	if f := cbridge.QPAttrFromC; f != nil {
		if v, ok := f(unsafe.Pointer(a)).(verbs.QPAttr); ok {
			return v
		}
	}
	return verbs.QPAttr{
		State:            verbs.QPState(a.qp_state),
		CurState:         verbs.QPState(a.cur_qp_state),
		PathMTU:          verbs.MTU(a.path_mtu),
		PathMigState:     uint8(a.path_mig_state),
		QKey:             uint32(a.qkey),
		RQPSN:            uint32(a.rq_psn),
		SQPSN:            uint32(a.sq_psn),
		DestQPNum:        uint32(a.dest_qp_num),
		AccessFlags:      verbs.Access(a.qp_access_flags),
		Cap:              verbs.QPCap{MaxSendWR: uint32(a.cap.max_send_wr), MaxRecvWR: uint32(a.cap.max_recv_wr), MaxSendSGE: uint32(a.cap.max_send_sge), MaxRecvSGE: uint32(a.cap.max_recv_sge), MaxInlineData: uint32(a.cap.max_inline_data)},
		AH:               ahAttrFromC(&a.ah_attr),
		AltAH:            ahAttrFromC(&a.alt_ah_attr),
		PKeyIndex:        uint16(a.pkey_index),
		AltPKeyIndex:     uint16(a.alt_pkey_index),
		EnSQDAsyncNotify: a.en_sqd_async_notify != 0,
		SQDraining:       a.sq_draining != 0,
		MaxQPRdAtomic:    uint8(a.max_rd_atomic),
		MaxDestRdAtomic:  uint8(a.max_dest_rd_atomic),
		MinRNRTimer:      uint8(a.min_rnr_timer),
		PortNum:          uint8(a.port_num),
		Timeout:          uint8(a.timeout),
		RetryCnt:         uint8(a.retry_cnt),
		RNRRetry:         uint8(a.rnr_retry),
		AltPortNum:       uint8(a.alt_port_num),
		AltTimeout:       uint8(a.alt_timeout),
	}
}

func ahAttrFromC(a *C.struct_ibv_ah_attr) verbs.AHAttr {
	if f := cbridge.AHAttrFromC; f != nil {
		if v, ok := f(unsafe.Pointer(a)).(verbs.AHAttr); ok {
			return v
		}
	}
	var g verbs.GID
	for i := range g {
		g[i] = byte(a.grh.dgid[i])
	}
	return verbs.AHAttr{
		GRH: verbs.GlobalRoute{
			DGID:         g,
			FlowLabel:    uint32(a.grh.flow_label),
			SGIDIndex:    uint8(a.grh.sgid_index),
			HopLimit:     uint8(a.grh.hop_limit),
			TrafficClass: uint8(a.grh.traffic_class),
		},
		DLID:        uint16(a.dlid),
		SL:          uint8(a.sl),
		SrcPathBits: uint8(a.src_path_bits),
		StaticRate:  uint8(a.static_rate),
		IsGlobal:    a.is_global != 0,
		PortNum:     uint8(a.port_num),
	}
}
